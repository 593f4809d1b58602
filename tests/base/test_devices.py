"""Devices and what they can do (`mlmclm.base.devices`): a device's peak FLOP/s by its exact name (issue 25)."""
import pytest
import torch

from mlmclm.base.devices import device_peak_flops


@pytest.mark.usefixtures('one_thread')   # tiny models: one thread is faster (conftest.py)
def test_peak_flops_match_exact_device_names(monkeypatch):
    "Substring matching gave an H100 PCIe the SXM part's 989 TFLOP/s and a GH200 nothing."
    for name, peak in (('NVIDIA H100 PCIe', 756.5e12), ('NVIDIA H100 NVL', 835.5e12), ('NVIDIA GH200 480GB', 989.4e12),
                       ('NVIDIA H100 80GB HBM3', 989.4e12), ('AMD Instinct MI250X', 191.5e12)):
        monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None, n=name: n)
        assert device_peak_flops('cuda') == peak, name
    monkeypatch.setattr(torch.cuda, 'get_device_name', lambda device=None: 'NVIDIA H100 SXM5 64GB')
    with pytest.warns(RuntimeWarning, match="unknown device 'NVIDIA H100 SXM5 64GB': no MFU"):
        assert device_peak_flops('cuda') is None
