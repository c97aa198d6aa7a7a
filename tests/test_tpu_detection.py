"""TPU chip detection, on a fake sysfs tree.

A TPU chip cannot exist on this machine, so these tests fake the only things detection
reads, as TorchTPU does: each PCI device's sysfs ``vendor``, ``device`` and ``iommu_group``,
and the group's entry under ``/dev/vfio``. No TPU runtime is touched.
"""

from __future__ import annotations

from pathlib import Path

from tpubench import peaks
from tpubench.backends.tpu import GOOGLE_PCI_VENDOR, PCI_DEVICE_TO_CHIP, tpu_chips, tpu_devices


def add_pci_device(root: Path, address: str, vendor: str, device: str, group: int, vfio: bool = True) -> None:
    """One PCI function in a fake sysfs; ``iommu_group`` is a symlink to its group, as in Linux."""
    groups = root / "sys/kernel/iommu_groups"
    (groups / str(group)).mkdir(parents=True, exist_ok=True)
    folder = root / "sys/bus/pci/devices" / address
    folder.mkdir(parents=True)
    (folder / "vendor").write_text(f"{vendor}\n")
    (folder / "device").write_text(f"{device}\n")
    (folder / "iommu_group").symlink_to(groups / str(group))
    if vfio:
        (root / "dev/vfio").mkdir(parents=True, exist_ok=True)
        (root / "dev/vfio" / str(group)).touch()


def test_chips_are_named_by_pci_device_id_and_count_only_with_their_vfio_group(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:00:04.0", GOOGLE_PCI_VENDOR, "0x0063", 3)
    add_pci_device(tmp_path, "0000:00:05.0", GOOGLE_PCI_VENDOR, "0x0099", 4)  # a generation not in the table
    add_pci_device(tmp_path, "0000:00:06.0", GOOGLE_PCI_VENDOR, "0x006f", 5, vfio=False)  # not usable
    add_pci_device(tmp_path, "0000:00:07.0", "0x10de", "0x2335", 6)  # an NVIDIA GPU
    assert tpu_chips(tmp_path) == ["TPU v5e", "TPU (PCI device 0x0099)"]


def test_a_host_without_google_pci_devices_has_no_chips(tmp_path: Path) -> None:
    assert tpu_chips(tmp_path) == []
    add_pci_device(tmp_path, "0000:00:07.0", "0x10de", "0x2335", 6)
    assert tpu_chips(tmp_path) == []


def test_every_detectable_generation_has_a_peak_and_v7_exposes_two_devices_per_chip() -> None:
    for chip in PCI_DEVICE_TO_CHIP.values():
        assert peaks.lookup(chip, "tpu").chip == chip
    assert tpu_devices(["TPU v7", "TPU v7"]) == 4
    assert tpu_devices(["TPU v5e"] * 4) == 4
    assert tpu_devices(["TPU (PCI device 0x0099)"]) == 1
