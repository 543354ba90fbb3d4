"""MIG through NVML: :class:`MigCalls`, the part of the facade that reads and changes MIG.

MIG mode (read and set), the GPU-instance profiles and their placements, the MIG devices
that exist, and creating and destroying them (one GPU instance with one compute instance
over all of it).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from typing import Any

import pynvml

from driver.errors import NvmlError
from driver.nvml import decode
from driver.nvml.calls import NvmlCalls
from driver.nvml.types import MigInstance, MigProfile

log = logging.getLogger(__name__)

MIB = 1 << 20
# Compute-instance profile index that takes a whole GI of N compute slices.
_FULL_CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_SKIP_PROFILE = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)
# nvmlDeviceGetMigDeviceHandleByIndex: no MIG device at this index (NVIDIA's walkers skip both).
_NO_MIG_DEVICE = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)
# nvmlDeviceGetGpuInstanceById / nvmlGpuInstanceGetComputeInstanceById: no such GI or CI id.
_NO_INSTANCE = (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT)


class MigCalls(NvmlCalls):
    """MIG mode, profiles, placements and instances of a GPU."""

    def set_mig_mode(self, uuid: str, enabled: bool) -> bool:
        """Set MIG mode; True if it applies now, False if it is pending a GPU reset (Ampere,
        or ``RESET_REQUIRED`` on a passthrough VM). An activation that failed (``IN_USE``:
        the GPU is not idle) is an :class:`NvmlError` with NVML's activation status."""
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        h = self.handle(uuid)
        status = int(self.call("nvmlDeviceSetMigMode", h, mode, gpu=uuid))
        current, pending = self.call("nvmlDeviceGetMigMode", h, gpu=uuid)
        if status not in (pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_RESET_REQUIRED):
            on = pynvml.NVML_DEVICE_MIG_ENABLE
            raise NvmlError(
                f"NVML nvmlDeviceSetMigMode on GPU {uuid}: MIG mode "
                f"{'enable' if enabled else 'disable'} was not activated: "
                f"{decode.error_name(status)} (code {status}); MIG mode is "
                f"{'on' if current == on else 'off'}, pending {'on' if pending == on else 'off'}",
                status,
            )
        applied = current == mode
        log.info(
            "mig mode set gpu=%s enabled=%s applied=%s status=%d", uuid, enabled, applied, status
        )
        return bool(applied)

    def mig_enabled(self, uuid: str) -> bool:
        """Whether MIG mode is on now (False where the GPU has no MIG): one NVML call."""
        return self._mig_mode(self.handle(uuid), uuid)[1]

    def mig_pending(self, uuid: str) -> bool:
        """Whether MIG mode is pending on: the mode the GPU takes at its next reset (False
        where the GPU has no MIG): one NVML call."""
        return self._mig_mode(self.handle(uuid), uuid)[2]

    def mig_instances(self, parent_uuid: str) -> tuple[MigInstance, ...]:
        """The MIG devices (GI with a CI) that exist on a GPU; empty when MIG is off."""
        h = self.handle(parent_uuid)
        capable, current, _ = self._mig_mode(h, parent_uuid)
        if not (capable and current):
            return ()
        return self._mig_instances(h, parent_uuid, self._mig_profiles(h, parent_uuid))

    def create_mig_instance(self, parent_uuid: str, profile_id: int, start: int) -> MigInstance:
        """Create a GPU instance at ``start`` with one compute instance over all of it.

        If the compute instance cannot be created, the GPU instance is destroyed again.
        """
        h = self.handle(parent_uuid)
        profile = next((p for p in self._mig_profiles(h, parent_uuid) if p.id == profile_id), None)
        if profile is None:
            raise NvmlError(
                f"GPU {parent_uuid}: MIG profile id {profile_id} is not supported",
                pynvml.NVML_ERROR_INVALID_ARGUMENT,
            )
        size = next((n for s, n in profile.placements if s == start), None)
        if size is None:
            raise NvmlError(
                f"GPU {parent_uuid}: MIG profile {profile.name} cannot start at memory slice "
                f"{start}; allowed starts {[s for s, _ in profile.placements]}",
                pynvml.NVML_ERROR_INVALID_ARGUMENT,
            )
        placement = pynvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        gi = self.call(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            h,
            profile_id,
            ctypes.pointer(placement),
            gpu=parent_uuid,
        )
        try:
            ci_info = self.call(
                "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                gi,
                _FULL_CI_PROFILE[profile.slice_count],
                pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                gpu=parent_uuid,
            )
            self.call("nvmlGpuInstanceCreateComputeInstance", gi, int(ci_info.id), gpu=parent_uuid)
        except (NvmlError, KeyError):
            self.call("nvmlGpuInstanceDestroy", gi, gpu=parent_uuid)
            raise
        gi_id = int(self.call("nvmlGpuInstanceGetInfo", gi, gpu=parent_uuid).id)
        for inst in self._mig_instances(h, parent_uuid, (profile,)):
            if inst.gi_id == gi_id:
                log.info(
                    "mig instance created gpu=%s profile=%s start=%d gi=%d uuid=%s",
                    parent_uuid,
                    profile.name,
                    start,
                    gi_id,
                    inst.uuid,
                )
                return inst
        raise NvmlError(
            f"GPU {parent_uuid}: created GI {gi_id} but no MIG device appeared",
            pynvml.NVML_ERROR_UNKNOWN,
        )

    def destroy_mig_instance(self, parent_uuid: str, gi_id: int) -> bool:
        """Destroy the compute instances of GI ``gi_id`` and then the GI.

        Returns False when the GI does not exist (already destroyed): safe to repeat.
        """
        h = self.handle(parent_uuid)
        try:
            gi = self.call("nvmlDeviceGetGpuInstanceById", h, gi_id, gpu=parent_uuid)
        except NvmlError as e:
            if e.code in _NO_INSTANCE:
                return False
            raise
        by_id = "nvmlGpuInstanceGetComputeInstanceById"
        for ci in self._each_found(by_id, gi, range(8), _NO_INSTANCE, parent_uuid):
            self.call("nvmlComputeInstanceDestroy", ci, gpu=parent_uuid)
        self.call("nvmlGpuInstanceDestroy", gi, gpu=parent_uuid)
        log.info("mig instance destroyed gpu=%s gi=%d", parent_uuid, gi_id)
        return True

    def _each_found(
        self, name: str, h: Any, indexes: range, absent: tuple[int, ...], uuid: str
    ) -> Iterator[Any]:
        """``lib.<name>(h, i)`` for each index ``i`` in turn, leaving out the indexes NVML
        answers with an error code in ``absent`` (no such profile, MIG device or compute
        instance there); any other error is raised."""
        for i in indexes:
            try:
                found = self.call(name, h, i, gpu=uuid)
            except NvmlError as e:
                if e.code in absent:
                    continue
                raise
            yield found

    def _mig_mode(self, h: Any, uuid: str) -> tuple[bool, bool, bool]:
        try:
            current, pending = self.call("nvmlDeviceGetMigMode", h, gpu=uuid)
        except NvmlError as e:
            if e.code == pynvml.NVML_ERROR_NOT_SUPPORTED:
                return False, False, False
            raise
        enable = pynvml.NVML_DEVICE_MIG_ENABLE
        return True, current == enable, pending == enable

    def _mig_state(
        self, h: Any, uuid: str, capable: bool, current: bool
    ) -> tuple[tuple[MigProfile, ...], tuple[MigInstance, ...], str | None]:
        """Profiles, instances, and the error that left both out (one GPU's MIG query
        failing must not stop discovery of the node; a lost GPU still does)."""
        if not capable:
            return (), (), None
        try:
            profiles = self._mig_profiles(h, uuid)
            instances = self._mig_instances(h, uuid, profiles) if current else ()
        except NvmlError as e:
            if e.code == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise
            log.warning("mig query failed gpu=%s error=%s", uuid, e)
            return (), (), str(e)
        return profiles, instances, None

    def _mig_profiles(self, h: Any, uuid: str) -> tuple[MigProfile, ...]:
        profiles = []
        indexes = range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
        by_index = "nvmlDeviceGetGpuInstanceProfileInfo"
        for info in self._each_found(by_index, h, indexes, _SKIP_PROFILE, uuid):
            name = decode.text(info.name).removeprefix("MIG ")
            profiles.append(
                MigProfile(
                    id=int(info.id),
                    name=name,
                    slice_count=int(info.sliceCount),
                    memory_bytes=int(info.memorySizeMB) * MIB,
                    multiprocessors=int(info.multiprocessorCount),
                    copy_engines=int(info.copyEngineCount),
                    decoders=int(info.decoderCount),
                    encoders=int(info.encoderCount),
                    jpeg_engines=int(info.jpegCount),
                    ofa_engines=int(info.ofaCount),
                    instance_count=int(info.instanceCount),
                    placements=self._placements(h, uuid, int(info.id)),
                )
            )
        return tuple(profiles)

    def _placements(self, h: Any, uuid: str, profile_id: int) -> tuple[tuple[int, int], ...]:
        name = "nvmlDeviceGetGpuInstancePossiblePlacements"
        count = ctypes.c_uint(0)
        try:
            self.call(name, h, profile_id, None, ctypes.pointer(count), gpu=uuid)
            array = (pynvml.c_nvmlGpuInstancePlacement_t * max(1, count.value))()
            self.call(name, h, profile_id, array, ctypes.pointer(count), gpu=uuid)
        except NvmlError as e:
            if e.code not in _SKIP_PROFILE:
                raise
            log.info("mig placements unavailable gpu=%s profile=%d error=%s", uuid, profile_id, e)
            return ()
        return tuple((int(array[i].start), int(array[i].size)) for i in range(count.value))

    def _mig_instances(
        self, h: Any, uuid: str, profiles: tuple[MigProfile, ...]
    ) -> tuple[MigInstance, ...]:
        by_id = {p.id: p for p in profiles}
        out = []
        indexes = range(int(self.call("nvmlDeviceGetMaxMigDeviceCount", h, gpu=uuid)))
        by_index = "nvmlDeviceGetMigDeviceHandleByIndex"
        for mig in self._each_found(by_index, h, indexes, _NO_MIG_DEVICE, uuid):
            gi_id = int(self.call("nvmlDeviceGetGpuInstanceId", mig, gpu=uuid))
            ci_id = int(self.call("nvmlDeviceGetComputeInstanceId", mig, gpu=uuid))
            gi = self.call("nvmlDeviceGetGpuInstanceById", h, gi_id, gpu=uuid)
            info = self.call("nvmlGpuInstanceGetInfo", gi, gpu=uuid)
            profile = by_id.get(int(info.profileId))
            out.append(
                MigInstance(
                    uuid=decode.text(self.call("nvmlDeviceGetUUID", mig, gpu=uuid)),
                    parent_uuid=uuid,
                    profile_id=int(info.profileId),
                    profile_name=profile.name if profile else f"profile-{int(info.profileId)}",
                    gi_id=gi_id,
                    ci_id=ci_id,
                    placement=(int(info.placement.start), int(info.placement.size)),
                    memory_bytes=profile.memory_bytes if profile else 0,
                )
            )
        return tuple(out)
