"""GPUs beyond the paper's: datasheet numbers and the memory NVML reports (models/catalog/catalog.py)."""

from __future__ import annotations

import pytest

from scepsy.models.catalog import catalog

NEW = {"B200": 183359, "H100-PCIE": 81559, "RTX-PRO-6000": 97887, "A10G": 23028}


@pytest.mark.parametrize("name", sorted(NEW))
def test_new_gpus_carry_nominal_and_nvml_memory(name):
    card = catalog.gpu(name)
    assert card.source.startswith("https://")
    assert card.nvml_memory_mib == NEW[name] and card.nvml_memory_mib is not None
    # NVML reports a little less than the nominal capacity read as GiB (ECC and reserved memory)
    assert 0.9 * card.memory_gib * 1024 < card.nvml_memory_mib <= 1.02 * card.memory_gib * 1024


def test_nvml_product_names_find_the_new_gpus():
    assert catalog.gpu("NVIDIA H100 PCIe").name == "H100-PCIE"
    assert catalog.gpu("NVIDIA RTX PRO 6000 Blackwell Server Edition").name == "RTX-PRO-6000"
    assert catalog.gpu("nvidia b200").name == "B200"
    assert catalog.gpu("NVIDIA A10G").name == "A10G"
    assert catalog.gpu("H100").name == "H100-SXM"  # the bare name stays the SXM part
