"""Keep virtual-inference probes out of vLLM's per-request metrics.

npu-health-agent (like MindIE's engine server) sends a one-token probe with an
`X-Request-Id` containing `_virtual` every few seconds. Counted as traffic, those probes
inflate `vllm:request_success_total` and the per-request histograms (end-to-end, queue,
prefill, decode time, tokens per request). MindIE patches vLLM's output processor to skip
them; this plugin does the same from outside, through vLLM's `vllm.general_plugins` entry
point, so a stock vLLM image needs only `pip install`.

What is filtered: the per-request statistics of a finished request whose caller-supplied id
contains `_virtual` (a substring test: vLLM appends its own suffix to internal ids). What is
not: iteration-level counters (prompt and generation tokens, iteration histograms), which
describe work the engine really did, and the LoRA bookkeeping, which must still be released.

It works where vLLM keeps the caller's id apart from its internal one (vLLM 0.14 and later:
`RequestState.external_req_id`). On older versions it logs once that it cannot filter and
changes nothing. Loading it twice (vLLM loads general plugins in every process, sometimes more
than once) is harmless.
"""

import logging

# Under "vllm." so that vLLM's own logging configuration (handler, level, format) applies.
logger = logging.getLogger("vllm.vllm_virtual_filter")

MARKER = "_virtual"
MIN_VERSION = (0, 14)

_state = {"done": False, "patched": False, "reason": None, "announced": False}


def is_virtual(request_id):
    """Whether a caller's request id marks a virtual-inference probe (substring, as MindIE)."""
    return isinstance(request_id, str) and MARKER in request_id


def parse_version(text):
    """(major, minor) of a vLLM version string such as '0.32.0+cpu'; None if unparsable."""
    parts = []
    for piece in str(text).split("+")[0].split(".")[:2]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else None


def unsupported_reason(version, processor_cls, request_state_cls):
    """Why this vLLM cannot be patched, or None when it can.

    Checks the version and the shapes the patch relies on, so a vLLM that renamed them is
    left alone instead of being broken.
    """
    import inspect

    parsed = parse_version(version)
    if parsed is None:
        return f"cannot parse the vLLM version {version!r}"
    if parsed < MIN_VERSION:
        return (
            f"vLLM {version} does not keep the caller's request id apart from its own "
            f"(needs {MIN_VERSION[0]}.{MIN_VERSION[1]} or later)"
        )
    if processor_cls is None or not callable(
        getattr(processor_cls, "_update_stats_from_finished", None)
    ):
        return f"vLLM {version} has no OutputProcessor._update_stats_from_finished"
    try:
        params = inspect.signature(request_state_cls.__init__).parameters
    except (TypeError, ValueError, AttributeError):
        params = {}
    if "external_req_id" not in params:
        return f"vLLM {version}'s RequestState has no external_req_id"
    return None


def make_filter(original, sink_factory):
    """Wraps OutputProcessor._update_stats_from_finished.

    A virtual request's statistics go into a throw-away IterationStats from `sink_factory`,
    so the original still releases the LoRA state and tells the parent request, while the
    iteration's per-request records stay clean.
    """

    def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats):
        request_id = getattr(req_state, "external_req_id", None)
        if iteration_stats is not None and is_virtual(request_id):
            if not _state["announced"]:
                # Said at the first probe rather than at load time: vLLM loads plugins
                # before it configures its loggers, so a line logged then is lost.
                _state["announced"] = True
                logger.info(
                    "vllm-virtual-filter: keeping virtual request %s (and every later id "
                    "containing %r) out of per-request metrics",
                    request_id,
                    MARKER,
                )
            return original(self, req_state, finish_reason, sink_factory())
        return original(self, req_state, finish_reason, iteration_stats)

    _update_stats_from_finished.__wrapped__ = original
    _update_stats_from_finished._vllm_virtual_filter = True
    return _update_stats_from_finished


def register():
    """The `vllm.general_plugins` entry point."""
    if _state["done"]:
        return
    _state["done"] = True
    try:
        import vllm
        from vllm.v1.engine import output_processor as op
        from vllm.v1.metrics.stats import IterationStats
    except Exception as e:  # noqa: BLE001 - any import failure means: leave vLLM alone
        _state["reason"] = f"cannot import vLLM's output processor: {e}"
        logger.warning("vllm-virtual-filter: %s; nothing patched", _state["reason"])
        return
    processor = getattr(op, "OutputProcessor", None)
    reason = unsupported_reason(
        getattr(vllm, "__version__", "unknown"), processor, getattr(op, "RequestState", None)
    )
    if reason is not None:
        _state["reason"] = reason
        logger.warning("vllm-virtual-filter: %s; nothing patched", reason)
        return
    current = processor._update_stats_from_finished
    if getattr(current, "_vllm_virtual_filter", False):
        _state["patched"] = True
        return
    processor._update_stats_from_finished = make_filter(current, IterationStats)
    _state["patched"] = True
    logger.info(
        "vllm-virtual-filter: requests whose id contains %r are kept out of per-request metrics",
        MARKER,
    )
