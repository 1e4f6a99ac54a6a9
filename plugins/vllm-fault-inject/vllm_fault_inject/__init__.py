"""A wedged accelerator, on demand, inside a real vLLM. TEST ONLY.

npu-health-agent must tell an engine whose NPU is stuck (a kernel that never completes, a
thread blocked in the driver) from one that is merely slow. Without an NPU, this plugin makes
the same thing happen in vLLM's own Worker process: while the file named by the environment
variable NPU_HEALTH_VLLM_STUCK_FILE exists, the Worker's model step
(`WorkerWrapperBase.execute_model`, the method the executor calls in the Worker for every
scheduler step) does not return. The file's content picks how it waits:

- `spin` (or an empty file, or anything not `block`): a busy Python loop, so the Worker burns a
  core, like a kernel spinning on a device;
- `block`: sleeps in 50 ms steps, so the Worker's CPU time stays flat, like a thread blocked
  in the driver.

The mode is read again every 50 ms. When the file is removed, the step runs as usual and the
engine carries on with the requests it held. The API server and the EngineCore are not
touched: `/health` keeps answering 200 and `/metrics` keeps answering, with the values the
scheduler last published.

Without the variable the plugin changes nothing. vLLM loads general plugins in every one of its
processes; each one that loads it says so once on stderr (vLLM configures its loggers after
loading plugins, so a logger line at load time would be lost). Only the Worker ever runs the
wrapped method.
"""

import os
import sys
import time

ENV = "NPU_HEALTH_VLLM_STUCK_FILE"
STEP = 0.05

_state = {"done": False, "patched": False, "path": None}


def say(message):
    """One line on stderr, which `scripts/real-vllm up` sends to the instance's log."""
    print(f"vllm-fault-inject[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def mode_of(path):
    """`spin`, `block`, or None when the file does not exist (the fault is off)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(64).strip().lower()
    except FileNotFoundError:
        return None
    except OSError:
        # Unreadable but present: still stuck, the default way.
        return "spin"
    return "block" if text == "block" else "spin"


def spin(seconds, clock=time.monotonic):
    """Keeps the CPU busy for `seconds`; returns the loop count (a sign it spun)."""
    end = clock() + seconds
    n = 0
    while clock() < end:
        n += 1
    return n


def hold(path, sleep=time.sleep, clock=time.monotonic, mode=mode_of):
    """Waits while `path` exists; returns (seconds held, modes seen), (0.0, ()) at once when
    it does not."""
    current = mode(path)
    if current is None:
        return 0.0, ()
    start = clock()
    seen = []
    while current is not None:
        if not seen or seen[-1] != current:
            seen.append(current)
        if current == "block":
            sleep(STEP)
        else:
            spin(STEP, clock)
        current = mode(path)
    return clock() - start, tuple(seen)


def describe(args):
    """What the held step was to compute: its scheduled tokens and new and running requests
    (from vLLM's SchedulerOutput; empty when the shape is not that)."""
    out = args[0] if args else None
    parts = []
    for label, attr in [("tokens", "total_num_scheduled_tokens")]:
        v = getattr(out, attr, None)
        if v is not None:
            parts.append(f"{label} {v}")
    new = getattr(out, "scheduled_new_reqs", None)
    if new is not None:
        parts.append(f"new requests {len(new)}")
    cached = getattr(getattr(out, "scheduled_cached_reqs", None), "req_ids", None)
    if cached is not None:
        parts.append(f"running requests {len(cached)}")
    return ", ".join(parts) or "step"


def make_stuck(original, path, hold=hold, say=say):
    """Wraps `execute_model` so that it holds while the stuck file exists."""

    def execute_model(self, *args, **kwargs):
        if os.path.exists(path):
            say(f"stuck file {path} present: the model step waits ({describe(args)})")
            held, modes = hold(path)
            say(f"stuck file removed after {held:.1f} s ({'/'.join(modes)}): the step runs")
        return original(self, *args, **kwargs)

    execute_model.__wrapped__ = original
    execute_model._vllm_fault_inject = True
    return execute_model


def register():
    """The `vllm.general_plugins` entry point."""
    if _state["done"]:
        return
    _state["done"] = True
    path = os.environ.get(ENV, "")
    if not path:
        say(f"{ENV} is not set: nothing patched")
        return
    try:
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except Exception as e:  # noqa: BLE001 - any import failure means: leave vLLM alone
        say(f"cannot import vLLM's WorkerWrapperBase ({e}): nothing patched")
        return
    current = getattr(WorkerWrapperBase, "execute_model", None)
    if not callable(current):
        say("vLLM's WorkerWrapperBase has no execute_model: nothing patched")
        return
    if not getattr(current, "_vllm_fault_inject", False):
        WorkerWrapperBase.execute_model = make_stuck(current, path)
    _state["patched"] = True
    _state["path"] = path
    say(f"ACTIVE (test only): the Worker's model step waits while {path} exists (spin|block)")
