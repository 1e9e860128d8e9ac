"""``params.device: auto`` follows what Ray gave the actor, not what the machine has."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from raymvc.protocols import _torch


def _fake_ray(actor_id, gpu_ids):
    ctx = types.SimpleNamespace(get_actor_id=lambda: actor_id)
    return types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: ctx,
                                 get_gpu_ids=lambda: list(gpu_ids))


@pytest.mark.parametrize(("actor_id", "gpus", "want"), [
    ("a1", [], "cpu"),        # an actor Ray gave no GPU trains on the CPU, though the machine has one
    ("a1", [0], "cuda"),      # an actor given a GPU uses it
    (None, [], "cuda"),       # the driver (in-process backend) uses the machine's GPU
])
def test_auto_device_in_and_outside_ray_actors(monkeypatch, actor_id, gpus, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(actor_id, gpus))
    assert _torch.resolve_device("auto").type == want


def test_auto_device_without_cuda_is_cpu_and_cuda_asked_for_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "ray", _fake_ray("a1", [0]))
    assert _torch.resolve_device("auto").type == "cpu"
    with pytest.raises(ValueError, match="params.device: cuda was asked for"):
        _torch.resolve_device("cuda")


def test_outside_ray_there_are_no_gpu_ids(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert _torch.ray_gpu_ids() is None
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False))
    assert _torch.ray_gpu_ids() is None


def test_gpu_ids_in_a_real_ray_actor(ray_session):
    """In a Ray actor, the ids Ray gave it (none: an empty list); outside any actor, None."""
    ray = ray_session

    @ray.remote(num_cpus=0.1)
    class Probe:
        def ids(self):
            from raymvc.protocols._torch import ray_gpu_ids

            return ray_gpu_ids()

    with_gpu = Probe.options(num_gpus=0.5).remote()
    without = Probe.remote()
    try:
        assert len(ray.get(with_gpu.ids.remote(), timeout=120)) == 1
        assert ray.get(without.ids.remote(), timeout=120) == []
        assert _torch.ray_gpu_ids() is None  # the driver
    finally:
        for a in (with_gpu, without):
            ray.kill(a)
