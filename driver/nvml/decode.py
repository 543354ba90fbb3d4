"""Turning NVML's raw values into Tranche's: names for enums, normal PCI addresses."""

from __future__ import annotations

import pynvml

ARCHITECTURES = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}
# As go-nvlib's GetBrandAsString spells them (NVIDIA's DRA driver publishes these).
BRANDS = {
    pynvml.NVML_BRAND_UNKNOWN: "Unknown",
    pynvml.NVML_BRAND_QUADRO: "Quadro",
    pynvml.NVML_BRAND_TESLA: "Tesla",
    pynvml.NVML_BRAND_NVS: "NVS",
    pynvml.NVML_BRAND_GRID: "Grid",
    pynvml.NVML_BRAND_GEFORCE: "GeForce",
    pynvml.NVML_BRAND_TITAN: "Titan",
    pynvml.NVML_BRAND_NVIDIA_VAPPS: "NvidiaVApps",
    pynvml.NVML_BRAND_NVIDIA_VPC: "NvidiaVPC",
    pynvml.NVML_BRAND_NVIDIA_VCS: "NvidiaVCS",
    pynvml.NVML_BRAND_NVIDIA_VWS: "NvidiaVWS",
    pynvml.NVML_BRAND_NVIDIA_CLOUD_GAMING: "NvidiaCloudGaming",
    pynvml.NVML_BRAND_QUADRO_RTX: "QuadroRTX",
    pynvml.NVML_BRAND_NVIDIA_RTX: "NvidiaRTX",
    pynvml.NVML_BRAND_NVIDIA: "Nvidia",
    pynvml.NVML_BRAND_GEFORCE_RTX: "GeForceRTX",
    pynvml.NVML_BRAND_TITAN_RTX: "TitanRTX",
}
# nvmlDeviceGpuRecoveryAction_t, by value (names without the NVML_GPU_RECOVERY_ACTION_ prefix).
RECOVERY_ACTIONS = (
    "NONE",
    "GPU_RESET",
    "NODE_REBOOT",
    "DRAIN_P2P",
    "DRAIN_AND_RESET",
    "RECOVER_IMEX_DOMAIN",
    "BUS_RESET",
    "SYSTEM_REBOOT",
)
COMPUTE_MODES = {
    pynvml.NVML_COMPUTEMODE_DEFAULT: "Default",
    pynvml.NVML_COMPUTEMODE_PROHIBITED: "Prohibited",
    pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "ExclusiveProcess",
}
_ERROR_NAMES = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_")
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
}


def error_name(code: int) -> str:
    """``15`` → ``"GPU_IS_LOST"``."""
    return _ERROR_NAMES.get(code, f"UNKNOWN_{code}")


def architecture(value: int) -> str:
    return ARCHITECTURES.get(value, "Unknown")


def brand(value: int) -> str:
    return BRANDS.get(value, "Unknown")


def recovery_action(value: int) -> str | None:
    return RECOVERY_ACTIONS[value] if 0 <= value < len(RECOVERY_ACTIONS) else None


def text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def pci_bus_id(raw: str | bytes) -> str:
    """NVML's ``"00000000:18:00.0"`` → ``"0000:18:00.0"`` (four-digit domain, lowercase)."""
    value = text(raw).strip().lower()
    domain, sep, rest = value.partition(":")
    if not sep:
        return value
    return f"{int(domain, 16):04x}:{rest}"
