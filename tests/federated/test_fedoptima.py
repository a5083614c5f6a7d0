"""FedOptima's pure parts: put()/get() against hand-worked sequences, grants under ω, the split rule, the
default auxiliary network and the asynchronous aggregator."""
from __future__ import annotations

import numpy as np
import pytest

from nebula.federated.fedoptima import (ActivationBatch, AsyncAggregator, DeviceInfo, LayerCostPerSample, ModelUpdate,
                                        SchedulerError, TaskScheduler, check_split, default_auxiliary,
                                        profile_layers, split_point)



def _granted_put(s, k, tag):
    assert k in s.grant([k]) or k in s.grants, f"{k} got no grant"
    s.put(ActivationBatch(k, tag))


def test_get_prefers_models_fifo_then_least_used_device():
    s = TaskScheduler(devices=["a", "b", "c"], omega=100)
    # hand-worked: a (fast) sends 4 batches, b 2, c 1, then two models arrive
    for tag in ("a1", "a2", "a3", "a4"):
        _granted_put(s, "a", tag)
    for tag in ("b1", "b2"):
        _granted_put(s, "b", tag)
    _granted_put(s, "c", "c1")
    s.put(ModelUpdate("b", "mb", version=0))
    s.put(ModelUpdate("a", "ma", version=0))
    got = [s.get().content for _ in range(9)]
    # models first in arrival order; then counters all 0 -> a (given first), then b, c (each now 1), then
    # a vs b at 1 -> a, b; c is empty; then a, a
    assert got == ["mb", "ma", "a1", "b1", "c1", "a2", "b2", "a3", "a4"]
    assert s.get() is None
    assert s.counters == {"a": 4, "b": 2, "c": 1}


def test_slow_device_batches_jump_ahead_of_a_fast_backlog():
    s = TaskScheduler(devices=["fast", "slow"], omega=100)
    for i in range(5):
        _granted_put(s, "fast", f"f{i}")
    assert [s.get().content for _ in range(3)] == ["f0", "f1", "f2"]
    _granted_put(s, "slow", "s0")
    # slow has used 0 batches, fast 3: the slow batch goes next although it arrived last
    assert s.get().content == "s0"
    assert [s.get().content for _ in range(2)] == ["f3", "f4"]


def test_grants_keep_held_plus_granted_under_omega_with_many_fast_devices():
    devices = list(range(40))
    s = TaskScheduler(devices=devices, omega=6)
    rng = np.random.default_rng(0)
    sent = 0
    for _ in range(500):
        for k in s.grant():
            # every granted device answers (fast devices), then the server trains on one batch
            s.put(ActivationBatch(k, "x"))
            sent += 1
            assert s.reserved <= 6
        if rng.random() < 0.5:
            s.get()
        assert s.held <= 6 and s.reserved <= 6
    assert s.peak_held <= 6 and sent > 200
    # every device got to contribute although only 6 slots exist for 40 devices
    assert min(s.counters.values()) > 0


def test_activation_without_grant_or_from_unknown_device_is_refused():
    s = TaskScheduler(devices=["a"], omega=1)
    with pytest.raises(SchedulerError, match="without a grant"):
        s.put(ActivationBatch("a", "x"))
    with pytest.raises(SchedulerError, match="unknown device 'z'"):
        s.put(ModelUpdate("z", "m", version=0))
    assert s.grant() == ["a"] and s.grant() == []  # one slot, already reserved


@pytest.mark.parametrize("omega", [0, -3, 1.5, True])
def test_omega_must_be_positive_integer(omega):
    with pytest.raises(ValueError, match="omega.*positive integer"):
        TaskScheduler(devices=["a"], omega=omega)


def test_grant_of_a_device_that_never_reports_expires():
    now = [0.0]
    s = TaskScheduler(devices=["dead", "live"], omega=1, grant_timeout_s=5.0, clock=lambda: now[0])
    assert s.grant() == ["dead"]
    assert s.grant() == []  # the slot is held by the silent device
    now[0] = 6.0
    assert s.grant() == ["dead"] and s.expired == ["dead"]  # it may still send: its slot is re-granted
    now[0] = 12.0
    assert s.grant(active=["live"]) == ["live"]  # the server no longer counts it as active


def test_split_rule_balances_compute_and_transfer():
    # layer 1 has a huge output (slow to send), layer 2 a small one; layer 3 is costly to compute
    prof = [LayerCostPerSample(flops=1e6, output_bytes=4_000_000), LayerCostPerSample(flops=1e6, output_bytes=4_000),
            LayerCostPerSample(flops=1e10, output_bytes=40), LayerCostPerSample(flops=1e3, output_bytes=40)]
    slow_link = [DeviceInfo(flops_per_s=1e9, bandwidth_bytes_per_s=1e6)]
    # costs per split: l=1: 3e-3 + 4 s; l=2: 6e-3 + 4e-3 s; l=3: 30 s + ...: l=2 wins
    assert split_point(prof, slow_link) == 2
    fast_link = [DeviceInfo(flops_per_s=1e9, bandwidth_bytes_per_s=1e12)]
    assert split_point(prof, fast_link) == 1
    # the slowest device decides
    assert split_point(prof, fast_link + slow_link) == 2


@pytest.mark.parametrize("split", [0, 4, -1, 2.5])
def test_split_outside_the_model_is_refused(split):
    with pytest.raises(ValueError, match="outside the model.*between 1 and 3"):
        check_split(split, 4)


def test_device_info_must_be_positive():
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s=0"):
        DeviceInfo(flops_per_s=1e9, bandwidth_bytes_per_s=0)


def test_profile_and_default_auxiliary_for_linear_and_conv():
    import paddle
    import paddle.nn as nn

    paddle.seed(0)
    mlp = [nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)]
    x = paddle.randn([3, 8])
    prof = profile_layers(mlp, x)
    assert prof[0].flops == 2 * 8 * 16 and prof[0].output_bytes == 16 * 4 and prof[2].output_bytes == 4 * 4
    aux = default_auxiliary(mlp[:2], x, num_classes=5)
    kinds = [type(m).__name__ for m in aux]
    assert kinds == ["Linear", "ReLU", "Flatten", "Linear"]
    assert aux(mlp[1](mlp[0](x))).shape == [3, 5]

    cnn = [nn.Conv2D(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2)]
    img = paddle.randn([2, 1, 8, 8])
    prof = profile_layers(cnn, img)
    assert prof[0].flops == 2 * 4 * 8 * 8 * 9 and prof[2].output_bytes == 4 * 4 * 4 * 4
    aux = default_auxiliary(cnn, img, num_classes=3)
    # feature maps are averaged over positions before the classifier: 4 inputs to it, not 4 x 4 x 4
    assert [type(m).__name__ for m in aux] == ["Conv2D", "ReLU", "AdaptiveAvgPool2D", "Flatten", "Linear"]
    assert aux[0]._kernel_size == [3, 3] and aux[-1].weight.shape == [4, 3]
    h = cnn[2](cnn[1](cnn[0](img)))
    assert aux(h).shape == [2, 3]
    with pytest.raises(ValueError, match="no layer with weights"):
        default_auxiliary([nn.ReLU()], img, num_classes=3)


class _Bottleneck:
    """A residual bottleneck (expand 1x1, depthwise 3x3, project 1x1) with an optional stride and widening."""

    @staticmethod
    def make(cin: int, cout: int, stride: int):
        import paddle.nn as nn

        class Block(nn.Layer):
            def __init__(self) -> None:
                super().__init__()
                self.expand = nn.Conv2D(cin, 4 * cin, 1)
                self.depthwise = nn.Conv2D(4 * cin, 4 * cin, 3, stride=stride, padding=1, groups=4 * cin)
                self.project = nn.Conv2D(4 * cin, cout, 1)
                self.act = nn.ReLU()

            def forward(self, x):
                y = self.project(self.act(self.depthwise(self.act(self.expand(x)))))
                return y + x if y.shape == x.shape else y

        return Block()


def test_composite_blocks_are_profiled_by_their_leaves_and_copied_as_auxiliary():
    import paddle
    import paddle.nn as nn

    paddle.seed(0)
    keep = _Bottleneck.make(8, 8, 1)
    img = paddle.randn([2, 8, 6, 6])
    (prof,) = profile_layers([keep], img)
    # the three convolutions inside, at 6x6: 1x1 8->32, depthwise 3x3 on 32, 1x1 32->8 (plus the ReLUs' outputs)
    convs = 2 * 36 * (32 * 8) + 2 * 36 * (32 * 9) + 2 * 36 * (8 * 32)
    assert convs <= prof.flops <= convs + 2 * 32 * 36 and prof.output_bytes == 8 * 36 * 4
    # a block that keeps its shape is copied as the auxiliary layer (its own parameters, not shared)
    aux = default_auxiliary([keep], img, num_classes=5)
    assert type(aux[0]).__name__ == "Block" and aux[0] is not keep
    assert aux[0].expand.weight is not keep.expand.weight
    assert aux(keep(img)).shape == [2, 5]
    # a strided, widening block cannot read its own output: the kind of its last convolution stands in
    down = _Bottleneck.make(8, 16, 2)
    aux = default_auxiliary([down], img, num_classes=5)
    assert [type(m).__name__ for m in aux] == ["Conv2D", "ReLU", "AdaptiveAvgPool2D", "Flatten", "Linear"]
    assert aux[0]._kernel_size == [1, 1] and aux[0].weight.shape[:2] == [16, 16]
    assert aux(down(img)).shape == [2, 5]
    with pytest.raises(ValueError, match="no default auxiliary layer for a"):
        default_auxiliary([nn.PReLU()], paddle.randn([2, 16]), num_classes=3)


def test_async_aggregator_mixes_by_staleness_and_skips_past_max_delay():
    g = {"w": np.zeros(2, np.float32)}
    agg = AsyncAggregator(g, {"a": np.zeros(1, np.float32)}, alpha=0.5, staleness="constant", max_delay=1)
    assert agg.apply({"w": np.full(2, 2, np.float32)}, {"a": np.ones(1, np.float32)}, version=0)
    np.testing.assert_allclose(agg.device["w"], [1, 1])  # 0.5*0 + 0.5*2
    assert agg.version == 1
    assert agg.apply({"w": np.full(2, 3, np.float32)}, {"a": np.ones(1, np.float32)}, version=0)  # staleness 1
    np.testing.assert_allclose(agg.device["w"], [2, 2])
    assert not agg.apply({"w": np.full(2, 9, np.float32)}, {"a": np.ones(1, np.float32)}, version=0)  # 2 > D
    assert agg.version == 2 and agg.skipped == 1
    with pytest.raises(ValueError, match="version 7 is not one the server issued"):
        agg.apply({"w": np.zeros(2, np.float32)}, {"a": np.ones(1, np.float32)}, version=7)
    with pytest.raises(ValueError, match="shape"):
        agg.apply({"w": np.zeros(3, np.float32)}, {"a": np.ones(1, np.float32)}, version=2)


def test_messages_round_trip_and_malformed_ones_are_named():
    from nebula.messaging import ProtocolError as MessageError, pack, unpack

    parts = pack({"type": "act"}, {"h": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array([1, 0])})
    head, arrays = unpack([bytes(p) for p in parts])
    assert head == {"type": "act"} and arrays["h"].shape == (2, 3) and arrays["y"].tolist() == [1, 0]
    with pytest.raises(MessageError, match="malformed message from B/3"):
        unpack([b"not json"], "B/3")
    with pytest.raises(MessageError, match="malformed message from B/3"):
        unpack(parts[:2], "B/3")  # an array missing
    with pytest.raises(MessageError, match="malformed message from B/3"):
        unpack([parts[0], b"\x00" * 5, bytes(parts[2])], "B/3")  # wrong byte count for its shape


def test_server_refuses_ungranted_activations_and_keeps_serving(caplog):
    from nebula.federated.fedoptima.runtime import ServerResult, _on_message

    s = TaskScheduler(devices=["d0", "d1"], omega=2)
    res, byes = ServerResult(), {}
    h = {"h": np.zeros((2, 3), np.float32), "y": np.zeros(2, np.int64)}
    _on_message(s, res, byes, "d0", {"type": "act"}, h)  # no grant yet
    assert s.held == 0 and "without a grant" in caplog.text
    s.grant()
    _on_message(s, res, byes, "d1", {"type": "act"}, h)
    _on_message(s, res, byes, "d1", {"type": "model"}, {})  # no version: refused, named
    assert s.held == 1 and "refused" in caplog.text and not s.model_queue


def test_virtual_clock_runs_events_in_time_order_and_links_carry_one_transfer_at_a_time():
    from nebula.federated.fedoptima.virtual_clock import Mailbox, SimActor, SimLink, VirtualClock

    clock, seen = VirtualClock(), []
    for t, tag in ((2.0, "b"), (1.0, "a"), (2.0, "c"), (5.0, "late")):
        clock.at(t, lambda tag=tag: seen.append((tag, clock.now)))
    clock.run(3.0)
    assert seen == [("a", 1.0), ("b", 2.0), ("c", 2.0)] and clock.now == 3.0  # same time: scheduled first, run first

    clock = VirtualClock()
    box, link, arrivals = Mailbox(clock), SimLink(clock, bw=100.0, latency=0.5), []

    def sender():
        link.send(box, "x", 100)  # 1 s on the link, then 0.5 s latency
        link.send(box, "y", 100)  # behind x: leaves the link at 2 s
        yield "compute", 5.0

    def receiver():
        while True:
            yield "wait", box
            arrivals.append((box.items.popleft(), clock.now))

    s, r = SimActor(clock, sender(), until=3.0), SimActor(clock, receiver(), until=3.0)
    clock.run(3.0)
    assert arrivals == [("x", 1.5), ("y", 2.5)]
    assert s.busy == 3.0 and r.busy == 0.0  # busy seconds stop at `until`; waiting is not busy


def test_virtual_clock_fedoptima_against_baselines_on_slow_and_fast_devices():
    from nebula.federated.fedoptima.simulate import SimSetting, simulate
    from tests.federated.fedoptima_task import BlobsTask

    s = SimSetting(slowdown=(3.0, 1.0, 1.0), device_flops_per_s=2e6, server_flops_per_s=2e7, wall_s=1.5,
                   local_iterations=4, split=2, omega=2, latency_s=0.002)
    fo, avg, oafl = (simulate(m, BlobsTask(), s) for m in ("fedoptima", "fedavg", "oafl"))
    for r in (fo, avg, oafl):
        assert 0 <= r.server_idle_s <= r.wall_s and all(0 <= b <= r.wall_s for b in r.device_busy_s)
    # synchronous FedAvg: the server only aggregates and fast devices wait for the slow one
    assert avg.server_idle_s > 0.9 * avg.wall_s
    # devices never wait for gradients in FedOptima; in offloading they do, every iteration
    assert fo.device_idle_s < oafl.device_idle_s and fo.device_idle_s < avg.device_idle_s
    assert fo.peak_held <= 2 and min(fo.used) > 0  # the slow device's batches are used too
    assert fo.accuracy > 0.5  # it learns in 1.5 virtual seconds (chance: 0.25)


def test_timing_without_training_gives_the_same_times_as_training():
    from nebula.federated.fedoptima.simulate import SimSetting, simulate
    from tests.federated.fedoptima_task import BlobsTask

    kw = dict(slowdown=(3.0, 1.0), device_flops_per_s=2e6, server_flops_per_s=2e7, wall_s=0.6, local_iterations=3,
              split=2, omega=2, latency_s=0.002)
    for method in ("fedoptima", "oafl", "fedavg"):
        real = simulate(method, BlobsTask(), SimSetting(**kw))
        timed = simulate(method, BlobsTask(), SimSetting(**kw, train=False))
        assert real.accuracy is not None and timed.accuracy is None
        assert timed.samples == real.samples > 0, method
        assert timed.server_busy_s == pytest.approx(real.server_busy_s), method
        assert timed.device_busy_s == pytest.approx(real.device_busy_s), method
        assert timed.used == real.used


def test_measured_flops_scale_with_the_simulated_slowdown():
    from nebula.federated.fedoptima.split import measure_flops_per_s

    f = measure_flops_per_s(size=64, repeats=3)
    assert f > 1e6  # any CPU does a 64x64 matmul well above a MFLOP/s
    slow = measure_flops_per_s(size=64, repeats=3, slowdown=1e6)
    assert slow < f / 1e3
