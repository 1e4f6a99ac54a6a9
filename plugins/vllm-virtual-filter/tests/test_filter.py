"""Unit tests of the plugin's logic, without vLLM (the real-vLLM test is
tests/real_engine/real_vllm.rs::virtual_filter_plugin_keeps_probes_out_of_request_success).

Run: python3 -m unittest discover -s plugins/vllm-virtual-filter/tests
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import vllm_virtual_filter as f  # noqa: E402


class Stats:
    def __init__(self):
        self.finished = []


class RequestState:
    def __init__(self, request_id, external_req_id, lora_name=None):
        self.request_id = request_id
        self.external_req_id = external_req_id


class OldRequestState:
    def __init__(self, request_id, lora_name=None):
        self.request_id = request_id


class Processor:
    def __init__(self):
        self.released = []

    def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats):
        if iteration_stats is None:
            return
        iteration_stats.finished.append((req_state.external_req_id, finish_reason))
        self.released.append(req_state.request_id)


class FilterTest(unittest.TestCase):
    def test_marker_is_a_substring_test(self):
        self.assertTrue(f.is_virtual("1733000000000000_virtual"))
        self.assertTrue(f.is_virtual("1733000000000000_virtual-1a2b3c4d"))
        self.assertFalse(f.is_virtual("cmpl-123"))
        self.assertFalse(f.is_virtual(None))

    def test_versions(self):
        self.assertEqual(f.parse_version("0.32.0+cpu"), (0, 32))
        self.assertEqual(f.parse_version("0.14.0rc1"), (0, 14))
        self.assertIsNone(f.parse_version("dev"))
        self.assertIsNone(f.unsupported_reason("0.32.0", Processor, RequestState))
        self.assertIn("0.14", f.unsupported_reason("0.10.2", Processor, RequestState))
        self.assertIn("external_req_id", f.unsupported_reason("0.20.0", Processor, OldRequestState))
        self.assertIn("OutputProcessor", f.unsupported_reason("0.20.0", None, RequestState))

    def test_virtual_requests_go_to_the_sink_and_still_release(self):
        sinks = []

        def sink():
            s = Stats()
            sinks.append(s)
            return s

        wrapped = f.make_filter(Processor._update_stats_from_finished, sink)
        p = Processor()
        stats = Stats()
        wrapped(p, RequestState("a-1", "user-1"), "stop", stats)
        wrapped(p, RequestState("b-2", "1733000000000000_virtual"), "length", stats)
        wrapped(p, RequestState("c-3", "user-2"), None, None)
        self.assertEqual(stats.finished, [("user-1", "stop")])
        self.assertEqual(len(sinks), 1)
        self.assertEqual(sinks[0].finished, [("1733000000000000_virtual", "length")])
        self.assertEqual(p.released, ["a-1", "b-2"], "LoRA state is released for probes too")


if __name__ == "__main__":
    unittest.main()
