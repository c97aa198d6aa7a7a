"""TPU chip detection, pinning and the XLA device guess, on a fake sysfs tree.

A TPU chip cannot exist on this machine, so these tests fake the only things detection
reads, as TorchTPU does: each PCI device's sysfs ``vendor``, ``device`` and ``iommu_group``,
and the group's entry under ``/dev/vfio``. No TPU runtime is touched. The ids are real ones:
TPU v5e 0x0063, v7 0x0076 (two functions per chip, one per TensorCore), and 0x0042, the gVNIC
network card every Google Cloud VM has under the same vendor id.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tpubench import peaks
from tpubench.backends.tpu import (
    GOOGLE_PCI_VENDOR,
    PCI_DEVICE_TO_CHIP,
    PIN_DEFAULTS,
    TpuBackend,
    pinned_groups,
    tpu_pci_devices,
)
from tpubench.backends.xla import XlaBackend, _pjrt_device

GVNIC = "0x0042"


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


def test_tpu_devices_are_named_by_pci_device_id_and_count_only_with_their_vfio_group(tmp_path: Path) -> None:
    add_pci_device(tmp_path, "0000:00:04.0", GOOGLE_PCI_VENDOR, "0x0063", 3)
    add_pci_device(tmp_path, "0000:00:03.0", GOOGLE_PCI_VENDOR, GVNIC, 2)  # the network card
    add_pci_device(tmp_path, "0000:00:05.0", GOOGLE_PCI_VENDOR, "0x0099", 4)  # TorchTPU does not count it either
    add_pci_device(tmp_path, "0000:00:06.0", GOOGLE_PCI_VENDOR, "0x006f", 5, vfio=False)  # not usable
    add_pci_device(tmp_path, "0000:00:07.0", "0x10de", "0x2335", 6)  # an NVIDIA GPU
    [device] = tpu_pci_devices(tmp_path)
    assert (device.address, device.chip, device.vfio_group) == ("0000:00:04.0", "TPU v5e", tmp_path / "dev/vfio/3")


def test_a_host_without_tpu_devices_has_none(tmp_path: Path) -> None:
    assert tpu_pci_devices(tmp_path) == []
    add_pci_device(tmp_path, "0000:00:07.0", "0x10de", "0x2335", 6)
    add_pci_device(tmp_path, "0000:00:04.0", GOOGLE_PCI_VENDOR, GVNIC, 1)  # a GCE CPU or GPU VM
    assert tpu_pci_devices(tmp_path) == []


def v7_host(root: Path, chips: int = 4) -> None:
    """A v7 VM: each chip shows its two TensorCores as two PCI functions, each with a VFIO group."""
    for function in range(2 * chips):
        add_pci_device(root, f"0000:00:{4 + function:02x}.0", GOOGLE_PCI_VENDOR, "0x0076", function)


@pytest.mark.skipif(importlib.util.find_spec("torch_tpu") is None, reason="install the [tpu] extra")
def test_device_count_is_the_vfio_functions_as_torchtpu_counts_them(tmp_path: Path) -> None:
    """8 TensorCore functions on a 4-chip v7 VM are 8 devices (not 16), named by generation."""
    v7_host(tmp_path)
    backend = TpuBackend()
    backend.root = tmp_path
    availability = backend.availability()
    assert (availability.available, availability.device_name, availability.device_count) == (True, "TPU v7", 8)


def test_every_detectable_generation_has_a_peak() -> None:
    for chip in PCI_DEVICE_TO_CHIP.values():
        assert peaks.lookup(chip, "tpu").chip == chip


def test_xla_guesses_a_tpu_from_tpu_device_ids_not_from_googles_vendor_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    backend = XlaBackend()
    backend.root = tmp_path
    add_pci_device(tmp_path, "0000:00:04.0", GOOGLE_PCI_VENDOR, GVNIC, 1)  # every GCE VM has one
    assert _pjrt_device(tmp_path) == "CPU" and backend.device_kind == "cpu"
    add_pci_device(tmp_path, "0000:00:05.0", GOOGLE_PCI_VENDOR, "0x0063", 2)
    assert _pjrt_device(tmp_path) == "TPU" and backend.device_kind == "tpu"
    monkeypatch.setenv("PJRT_DEVICE", "cpu")  # the user's choice wins
    assert _pjrt_device(tmp_path) == "CPU"


def test_a_pinned_run_waits_for_its_own_chips_groups(tmp_path: Path) -> None:
    """Chip i is the i-th chip in PCI address order; a v7 chip is two functions."""
    v7_host(tmp_path)
    devices = tpu_pci_devices(tmp_path)
    groups = [device.vfio_group for device in devices]
    assert pinned_groups(devices, "0") == groups[0:2]
    assert pinned_groups(devices, "1,3") == groups[2:4] + groups[6:8]
    assert pinned_groups(devices, "all of them") == groups  # not indexes: wait for every chip
    v5e = tmp_path / "v5e"
    for chip in range(4):
        add_pci_device(v5e, f"0000:00:{4 + chip:02x}.0", GOOGLE_PCI_VENDOR, "0x0063", chip)
    assert pinned_groups(tpu_pci_devices(v5e), "2") == [v5e / "dev/vfio/2"]


def test_tpu_family_workers_are_pinned_to_one_chip_and_the_users_choice_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in PIN_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    expected = {"TPU_VISIBLE_CHIPS": "0", "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_BOUNDS": "1,1,1"}
    for backend in (TpuBackend(), XlaBackend()):
        assert backend.worker_env.items() >= expected.items()
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "3")
    assert TpuBackend().worker_env["TPU_VISIBLE_CHIPS"] == XlaBackend().worker_env["TPU_VISIBLE_CHIPS"] == "3"
    monkeypatch.setenv("PJRT_DEVICE", "CPU")  # torch_xla on the CPU: nothing to pin
    assert not set(PIN_DEFAULTS) & set(XlaBackend().worker_env)
