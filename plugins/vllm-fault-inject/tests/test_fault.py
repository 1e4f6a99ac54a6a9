"""Unit tests of the fault plugin's logic, without vLLM (in a real vLLM:
tests/real_engine/engine_conformance.rs, the stuck assertions, and docs/real-vllm.md).

Run: python3 -m unittest discover -s plugins/vllm-fault-inject/tests
"""

import os
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import vllm_fault_inject as f  # noqa: E402


class FaultTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "stuck")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, text):
        with open(self.path, "w") as fh:
            fh.write(text)

    def test_modes(self):
        self.assertIsNone(f.mode_of(self.path))
        for text, mode in [("spin", "spin"), ("block\n", "block"), ("", "spin"), ("x", "spin")]:
            self.write(text)
            self.assertEqual(f.mode_of(self.path), mode, text)

    def test_no_file_no_wait(self):
        self.assertEqual(f.hold(self.path), (0.0, ()))

    def test_holds_until_removed_and_follows_the_mode(self):
        modes = iter(["block", "block", "spin", None])
        slept = []
        held, seen = f.hold(
            self.path,
            sleep=slept.append,
            clock=iter(range(100)).__next__,
            mode=lambda _: next(modes),
        )
        self.assertEqual(seen, ("block", "spin"))
        self.assertEqual(slept, [f.STEP, f.STEP])
        self.assertGreater(held, 0)

    def test_wrapped_step_waits_then_runs(self):
        calls = []
        lines = []

        def step(self, out):
            calls.append(out)
            return out

        wrapped = f.make_stuck(step, self.path, say=lines.append)
        self.assertEqual(wrapped(None, 1), 1)
        self.assertEqual(lines, [], "no file: no wait, nothing said")
        self.write("block")
        done = threading.Event()
        result = []
        t = threading.Thread(target=lambda: (result.append(wrapped(None, 2)), done.set()))
        t.start()
        self.assertFalse(done.wait(0.3), "the step must not return while the file exists")
        self.assertEqual(calls, [1])
        os.remove(self.path)
        self.assertTrue(done.wait(2))
        t.join()
        self.assertEqual((calls, result), ([1, 2], [2]))
        self.assertEqual(len(lines), 2)
        self.assertIn("removed", lines[1])

    def test_spin_burns_cpu(self):
        t0 = time.process_time()
        self.assertGreater(f.spin(0.1), 0)
        self.assertGreater(time.process_time() - t0, 0.05)

    def test_inactive_without_the_variable(self):
        os.environ.pop(f.ENV, None)
        f._state.update(done=False, patched=False, path=None)
        f.register()
        self.assertFalse(f._state["patched"])


if __name__ == "__main__":
    unittest.main()
