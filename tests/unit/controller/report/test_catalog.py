"""The device catalog from the driver's own ResourceSlices and claim statuses."""

from __future__ import annotations

from fractions import Fraction

from controller.report.catalog import DeviceInfo, catalog_from_slices
from driver.devices.inventory import DYNAMIC_MIG, build_inventory
from driver.devices.slices import build_slices
from tests.unit.gpu_values import SYSTEM, h100

NODE = "node-a"


def test_gpus_and_dynamic_mig_devices_of_prepared_claims() -> None:
    gpu, mig_gpu = h100(0), h100(1, mig_enabled=True)
    slices = build_slices(build_inventory([gpu, mig_gpu], SYSTEM, DYNAMIC_MIG), NODE)
    claim = {
        "status": {
            "devices": [
                {
                    "device": "gpu-00000001-mig-3g40gb-0",
                    "data": {"uuid": "MIG-new", "gpuUUID": mig_gpu.uuid, "migProfile": "3g.40gb"},
                }
            ]
        }
    }
    catalog = catalog_from_slices(slices, [claim, {"status": None}])
    assert catalog[gpu.uuid] == DeviceInfo(gpu.uuid, gpu.product_name)
    mig = catalog["MIG-new"]
    assert (mig.product, mig.profile) == (mig_gpu.product_name, "3g.40gb")
    assert mig.memory_share == Fraction(4, 8)
    assert mig.size == Fraction(3, 7)


def test_a_mig_device_of_a_gone_claim_is_unknown() -> None:
    slices = build_slices(build_inventory([h100(1, mig_enabled=True)], SYSTEM, DYNAMIC_MIG), NODE)
    assert "MIG-old" not in catalog_from_slices(slices)
