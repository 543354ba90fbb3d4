"""The node's sharing settings (``--sharing`` / ``TRANCHE_SHARING``): parsed once, frozen.

Which sharing groups get share devices on this node's GPUs, which mechanisms
are offered, how the shares are sized for the scheduler, and where the MPS
control binary is. Inline JSON/YAML or ``@FILE``::

    {"groups": ["blue", "red"], "mps": true, "maxShares": 8, "memoryStep": "1Gi"}
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from driver.errors import ConfigError
from driver.flags import flag_text
from driver.json_or_yaml import NotJsonOrYaml, parse_json_or_yaml
from driver.prepare.config import Bytes
from driver.trust.policy import MAX_SHARING_GROUP_LENGTH

DEFAULT_MPS_CONTROL = "nvidia-cuda-mps-control"
DEFAULT_MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SharingConfig(BaseModel):
    """How this node shares its GPUs. The defaults publish no share devices."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    # Sharing groups (trust level ``shared``) that get one share device per GPU and mechanism.
    groups: tuple[str, ...] = ()
    timeslice: bool = True  # publish <gpu>-ts-<group>
    mps: bool = True  # publish <gpu>-mps-<group>
    # Capacity ``shares`` of a share device: at most this many claims per GPU and group;
    # an MPS claim's active-thread percentage is its part of it.
    max_shares: int = Field(default=8, ge=1, le=1000, alias="maxShares")
    # Granularity of the consumable ``memory`` capacity (and the smallest request).
    memory_step: Bytes = Field(default=1 << 30, alias="memoryStep")
    mps_control: str = Field(default=DEFAULT_MPS_CONTROL, min_length=1, alias="mpsControl")
    mps_ready_timeout_s: float = Field(default=15.0, gt=0, le=300, alias="mpsReadyTimeoutSeconds")
    mps_check_interval_s: float = Field(default=5.0, gt=0, le=600, alias="mpsCheckIntervalSeconds")
    # Cgroup directories (one per hierarchy on cgroup v1, one on v2, as this process sees
    # them) the MPS control daemons start in, outside the plugin container's cgroup, so that
    # stopping the container does not end them; empty: the plugin's own cgroup.
    mps_cgroups: tuple[Path, ...] = Field(default=(), alias="mpsCgroups")
    # One /dev/shm for each MPS daemon and its clients: auto, on or off (mps_shm.py).
    mps_shared_shm: Literal["auto", "on", "off"] = Field(default="auto", alias="mpsSharedShm")
    mig_minors: Path = Field(default=DEFAULT_MIG_MINORS, alias="migMinors")
    cgroup_root: Path = Field(default=Path("/sys/fs/cgroup"), alias="cgroupRoot")

    @field_validator("groups")
    @classmethod
    def _check_groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for group in value:
            if len(group) > MAX_SHARING_GROUP_LENGTH or not _DNS_LABEL.match(group):
                raise ValueError(
                    f"sharing group {group!r} is not a DNS label of at most "
                    f"{MAX_SHARING_GROUP_LENGTH} characters"
                )
        if len(set(value)) != len(value):
            raise ValueError(f"a sharing group is listed twice: {list(value)}")
        return value

    @property
    def strategies(self) -> tuple[str, ...]:
        """The share mechanisms offered, as config strategies (``TimeSlicing``, ``MPS``)."""
        return tuple(s for s, on in (("TimeSlicing", self.timeslice), ("MPS", self.mps)) if on)


def parse_sharing(value: str | None, source: str = "--sharing") -> SharingConfig:
    """``value`` is inline JSON/YAML or ``@path``; empty gives the defaults (no shares)."""
    if not value or not value.strip():
        return SharingConfig()
    text, source = flag_text(value, source)
    try:
        data: Any = parse_json_or_yaml(text)
    except NotJsonOrYaml as e:
        raise ConfigError(f"{source}: not valid JSON or YAML: {e}") from e
    if data is None:
        return SharingConfig()
    if not isinstance(data, dict):
        raise ConfigError(f'{source}: expected a mapping such as {{"groups": ["blue"]}}')
    try:
        return SharingConfig.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in e.errors()
        )
        raise ConfigError(f"{source}: {problems}") from e
