"""Threads (issue 24, item 3): the kernels release the GIL while they run (as torch's own ops do),
two models trained at once from two Python threads give bitwise the results of training them one
after the other, and a state_dict read while another thread steps neither crashes nor changes
the result."""
import threading
import time

import torch

import fused_amp
from fused_amp import ops
from helpers import assert_bitwise_equal, adam_step_


def train(seed, steps=30, opt_cls=fused_amp.optim.AdamW, **opt_kw):
    """A small bf16 model, its optimizer and scaler, trained from ``seed``; the final params,
    masters and moments."""
    gen = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).bfloat16()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    opt = opt_cls(model.parameters(), lr=1e-3, max_grad_norm=1.0, **opt_kw)
    scaler = fused_amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for step in range(steps):
        x = torch.randn(16, 32, generator=gen).bfloat16()
        opt.zero_grad()
        loss = model(x).float().pow(2).mean() * (float("inf") if step == 7 else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return [t.detach().clone() for p in model.parameters()
            for t in [p] + [v for k, v in sorted(opt.state[p].items()) if isinstance(v, torch.Tensor)]]


def run_in_threads(*fns):
    results, errors = [None] * len(fns), []

    def run(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:  # surfaced below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors
    return results


def test_two_models_trained_at_once_equal_the_sequential_runs():
    for kw in (dict(), dict(master_weights="remainder8", state_dtype=torch.uint8),
               dict(master_weights="remainder", state_dtype=torch.bfloat16, stochastic_rounding=True)):
        sequential = [train(1, **kw), train(2, **kw)]
        threaded = run_in_threads(lambda: train(1, **kw), lambda: train(2, **kw))
        for seq, thr in zip(sequential, threaded):
            for a, b in zip(thr, seq):
                assert_bitwise_equal(a, b, str(kw))


def test_state_dict_read_while_another_thread_steps():
    stop = threading.Event()
    box = {}

    def reader():
        reads = 0
        while not stop.is_set():
            opt = box.get("opt")
            # from the end of the first step on: the state's entries exist (torch's state_dict,
            # ours alike, cannot be read while another thread is still adding them)
            states = list(opt.state.values()) if opt is not None else []
            if len(states) == 4 and all(float(s.get("step", 0)) > 0 for s in states):
                opt.state_dict()
                reads += 1
            # a reader that never sleeps holds the GIL for the interpreter's whole switch
            # interval (5 ms) each time the trainer gives it up: 30 s for 100 steps
            time.sleep(0.001)
        return reads

    def trainer():
        try:
            return train(3, steps=100,
                         opt_cls=lambda *a, **k: box.setdefault("opt", fused_amp.optim.AdamW(*a, **k)))
        finally:
            stop.set()

    result, reads = run_in_threads(trainer, reader)
    assert reads > 10, reads
    for a, b in zip(result, train(3, steps=100)):
        assert_bitwise_equal(a, b)


def test_the_kernels_release_the_gil():
    """A Python thread keeps running while a long step runs in another one."""
    n = 8_000_000
    p, g = [torch.randn(n).bfloat16()], [torch.randn(n).bfloat16()]
    m, a, b, s = [p[0].float()], [torch.zeros(n)], [torch.zeros(n)], [torch.zeros(())]
    counts = []

    def spin(until):
        c = 0
        while not until.is_set():
            c += 1
        counts.append(c)

    done = threading.Event()
    spinner = threading.Thread(target=spin, args=(done,))
    spinner.start()
    start = time.perf_counter()
    for _ in range(3):
        adam_step_(p, g, m, a, b, [], s, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
                       amsgrad=False, maximize=False, decoupled_weight_decay=False)
    took = time.perf_counter() - start
    done.set()
    spinner.join()
    # holding the GIL for the whole op would leave the spinner a few switch intervals (5 ms each)
    assert counts[0] > 1000 * took / 0.005, (counts[0], took)
