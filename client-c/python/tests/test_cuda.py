"""granary.cuda: the arena registered as pinned host memory (or the staging
fallback), non-blocking host-to-device copies of arena tensors, and
GranaryDataset(pin_memory=True).

The GPU tests skip, saying so on stderr, where CUDA is absent; run them on
a GPU machine with ``pytest -s`` to see which path was used and the
transfer rates."""

import gc
import os
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import granary  # noqa: E402
from granary import cuda  # noqa: E402
from granary.agent import LocalAgent  # noqa: E402
from granary.torch import GranaryDataset, as_tensor  # noqa: E402

MiB = 1 << 20
SMALL = (16, 1 * MiB)  # files, bytes each
BIG = (16, 16 * MiB)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
    print(msg, flush=True)


def _write(root, files: int, size: int, seed: int) -> None:
    """``files`` raw files of ``size`` bytes in two class folders."""
    g = torch.Generator().manual_seed(seed)
    for i in range(files):
        d = root / f"class_{i % 2:03d}"
        d.mkdir(exist_ok=True)
        data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g)
        (d / f"s{i:04d}.bin").write_bytes(data.numpy().tobytes())


@pytest.fixture(scope="module")
def raw_agent(tmp_path_factory):
    small = tmp_path_factory.mktemp("raw_small")
    _write(small, *SMALL, seed=1)
    datasets = {"small": small}
    if torch.cuda.is_available():
        big = tmp_path_factory.mktemp("raw_big")
        _write(big, *BIG, seed=2)
        datasets["big"] = big
    with LocalAgent(datasets) as a:
        yield a


@pytest.fixture
def gpu():
    if not torch.cuda.is_available():
        why = (
            f"SKIPPED granary.cuda GPU test: CUDA is not available here (torch {torch.__version__}, "
            "torch.cuda.is_available() is False); it runs where a GPU is"
        )
        _say(why)
        pytest.skip(why)
    return torch.device("cuda", torch.cuda.current_device())


def test_without_cuda_everything_still_works(raw_agent):
    """Runs everywhere: with no CUDA the pin is "off" and to_device is
    Tensor.to; with CUDA the pin is registered or staging."""
    with granary.open_session("small", raw_agent.socket, batch_size=4) as s:
        pin = cuda.pin_arena(s)
        _say(f"granary.cuda pin: {pin}")
        if torch.cuda.is_available():
            assert pin.mode in ("registered", "staging")
        else:
            assert pin.mode == "off" and "CUDA is not available" in pin.reason
        batch = s.next_batch()
        x = as_tensor(batch[0])
        y = cuda.to_device(x, "cpu")
        assert y.data_ptr() == x.data_ptr()  # no copy to the same device
        del x, y
        batch.release()
    ds = GranaryDataset("small", raw_agent.socket, batch_size=4, batches=True, pin_memory=True)
    n = 0
    for xs, ys in ds:
        assert xs.shape == (4, SMALL[1]) and ys.dtype == torch.int64
        n += 1
    assert n == SMALL[0] // 4


def _copy_every_sample(session, device) -> int:
    checked = 0
    for batch in session:
        outs = []
        for smp in batch:
            x = as_tensor(smp)
            outs.append((cuda.to_device(x, device, non_blocking=True), smp.tobytes()))
        del x
        torch.cuda.current_stream(device).synchronize()
        for g, want in outs:
            assert g.device == device
            assert g.cpu().numpy().tobytes() == want
            checked += 1
    return checked


def test_registered_or_staging_copies_match(raw_agent, gpu):
    with granary.open_session("small", raw_agent.socket, batch_size=4) as s:
        pin = cuda.pin_arena(s)
        _say(f"granary.cuda: arena of {pin.size} bytes -> {pin.mode}"
             + (f" (flags {pin.flags:#x})" if pin.flags is not None else f" ({pin.reason})"))
        assert pin.mode in ("registered", "staging")
        assert cuda.pin_arena(s) is pin  # idempotent
        if pin.mode == "registered":
            assert (pin.base, pin.size) in cuda.pinned_ranges()
            batch = s.next_batch()
            x = as_tensor(batch[0])
            assert x.is_pinned(), "a tensor viewing the registered arena is pinned"
            del x
            batch.release()
        assert _copy_every_sample(s, gpu) > 0
        cuda.wait_pending()
    gc.collect()
    if pin.mode == "registered":
        assert pin.unregister_result == 0, f"cudaHostUnregister returned {pin.unregister_result}"
        assert (pin.base, pin.size) not in cuda.pinned_ranges()


def test_staging_fallback_copies_match(raw_agent, gpu):
    with granary.open_session("small", raw_agent.socket, batch_size=4) as s:
        pin = cuda.pin_arena(s, register=False)
        assert pin.mode == "staging"
        batch = s.next_batch()
        x = as_tensor(batch[0])
        assert not x.is_pinned()
        del x
        batch.release()
        assert _copy_every_sample(s, gpu) > 0
        cuda.wait_pending()


def test_dataset_pin_memory_batches(raw_agent, gpu):
    ds = GranaryDataset("small", raw_agent.socket, batch_size=4, batches=True, pin_memory=True)
    n = 0
    for xs, ys in ds:
        assert xs.is_pinned(), "a stacked batch is page-locked with pin_memory=True"
        want = xs.clone()
        gx, gy = cuda.to_device((xs, ys), gpu)
        torch.cuda.current_stream(gpu).synchronize()
        assert torch.equal(gx.cpu(), want) and torch.equal(gy.cpu(), ys)
        n += 1
    assert n == SMALL[0] // 4
    ds = GranaryDataset("small", raw_agent.socket, batch_size=4, pin_memory=True)
    for x, y in ds:  # per sample: a view of the (registered) arena
        g = cuda.to_device(x, gpu)
        torch.cuda.current_stream(gpu).synchronize()
        assert torch.equal(g.cpu(), x)
    cuda.wait_pending()


def _rate(tensors, device, copy, reps=5):
    """Best GB/s over ``reps`` rounds of copying every tensor, and the host
    time the calls took (before the synchronise) in the best round."""
    total = sum(t.numel() for t in tensors)
    best, issue = 0.0, 0.0
    outs = None
    for _ in range(reps):
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        outs = [copy(t) for t in tensors]
        t1 = time.perf_counter()
        torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        gbs = total / (t2 - t0) / 1e9
        if gbs > best:
            best, issue = gbs, t1 - t0
    return best, issue, outs


def test_registered_copies_are_not_slower_than_pageable(raw_agent, gpu):
    files, size = BIG
    with granary.open_session("big", raw_agent.socket, batch_size=files) as s:
        pin = cuda.pin_arena(s)
        batch = s.next_batch()
        arena = [as_tensor(smp) for smp in batch]
        pageable = [t.clone() for t in arena]
        pinned = [t.clone().pin_memory() for t in arena]
        want = [t.clone() for t in arena]
        nb = lambda t: t.to(gpu, non_blocking=True)  # noqa: E731
        results = {
            f"arena ({pin.mode}), to_device": _rate(arena, gpu, lambda t: cuda.to_device(t, gpu)),
            "pageable copy, .to(non_blocking=True)": _rate(pageable, gpu, nb),
            "pageable copy, to_device (staging)": _rate(pageable, gpu, lambda t: cuda.to_device(t, gpu)),
            "torch pin_memory() copy, .to(non_blocking=True)": _rate(pinned, gpu, nb),
        }
        name = torch.cuda.get_device_name(gpu)
        _say(f"granary.cuda host-to-device, {files} x {size // MiB} MiB, {name}:")
        for what, (gbs, issue, outs) in results.items():
            _say(f"  {what:50s} {gbs:7.2f} GB/s  (calls returned after {issue * 1e3:7.2f} ms)")
            for g, w in zip(outs, want):
                assert torch.equal(g.cpu(), w), what
        if pin.mode == "registered":
            arena_gbs = results[f"arena ({pin.mode}), to_device"][0]
            page_gbs = results["pageable copy, .to(non_blocking=True)"][0]
            _say(f"  registered arena / pageable: {arena_gbs / page_gbs:.2f}x")
        out = os.environ.get("GRANARY_CUDA_REPORT")
        if out:
            with open(out, "a") as f:
                f.write(f"device {name}; pin {pin}\n")
                for what, (gbs, issue, _o) in results.items():
                    f.write(f"{what}: {gbs:.2f} GB/s, calls {issue * 1e3:.2f} ms\n")
        del arena, results
        cuda.wait_pending()
        batch.release()


def test_prefetch_delivers_every_batch_intact(raw_agent):
    """prefetch(): every batch once, its bytes intact, on the GPU where
    there is one (else fetched ahead on the CPU); an early break stops the
    thread."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    ds = GranaryDataset("small", raw_agent.socket, batch_size=4, batches=True, pin_memory=True, with_ids=True)
    want = {}
    with granary.open_session("small", raw_agent.socket, batch_size=SMALL[0]) as s:
        for smp in s.next_batch():
            want[smp.id] = smp.tobytes()
    seen = []
    for xs, ys, ids in cuda.prefetch(ds, device, depth=2):
        assert xs.device.type == device.type
        host = xs.cpu()
        for row, i in zip(host, ids.tolist()):
            assert row.numpy().tobytes() == want[i]
            seen.append(i)
    assert sorted(seen) == sorted(want)
    for _item in cuda.prefetch(ds, device):
        break
    cuda.wait_pending()


def test_prefetch_thread_runs_pytorch_on_one_thread(raw_agent):
    """prefetch()'s thread does its PyTorch work (a collate's torch.cat) with
    one intra-op thread, as a DataLoader worker does; the training loop's
    own setting is left as it was."""
    before = torch.get_num_threads()
    seen = []

    def collate(xs, labels):
        seen.append(torch.get_num_threads())
        return torch.cat(list(xs)), labels

    ds = GranaryDataset("small", raw_agent.socket, batch_size=4, batches=True, collate=collate)
    n = sum(1 for _ in cuda.prefetch(ds, "cpu", depth=2))
    assert n > 0 and seen and set(seen) == {1}, seen
    assert torch.get_num_threads() == before
