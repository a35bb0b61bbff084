"""An interrupt (KeyboardInterrupt, as Ctrl-C raises it) at the edges of a
protected call (docs/guard.md §Execution contract): between admission and
the binding, or while the call's locks are released.  No lock stays held, no
binding leaks, the tool never runs unrecorded, and the next call meets the
gate.
"""
from __future__ import annotations

import shutil
import unittest
from unittest import mock

from reliability_support import ProtectedCallCase, ReliabilityCase, Tool, call

from crash_recovery import guard as guard_module
from crash_recovery.guard import RecoveryGuard
from crash_recovery.storage import call_lock as call_lock_module
from crash_recovery.storage.call_lock import held_calls, probe_owner


class InterruptingBinding:
    """The guard's ContextVar, but ``reset`` is interrupted (KeyboardInterrupt)."""

    def __init__(self, real):
        self.real = real

    def get(self):
        return self.real.get()

    def set(self, value):
        return self.real.set(value)

    def reset(self, token):
        self.real.reset(token)
        raise KeyboardInterrupt


class InterruptingUnlock:
    """``fcntl`` of storage/call_lock.py, but unlocking is interrupted
    (KeyboardInterrupt) before it happens."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def flock(self, descriptor, operation):
        if operation == self.real.LOCK_UN:
            raise KeyboardInterrupt
        return self.real.flock(descriptor, operation)


class LockRelease(ReliabilityCase):
    """An interrupt while a call releases its binding or its call lock."""

    def test_an_interrupt_while_releasing_never_leaves_a_lock_held(self):
        for step in ("reset", "call_lock"):
            with self.subTest(step):
                shutil.rmtree(self.data_dir, ignore_errors=True)
                guard = RecoveryGuard(self.data_dir)
                self.addCleanup(guard.close)
                call(guard, Tool(), "warm")
                target = (mock.patch.object(guard_module, "ADMISSION",
                                            InterruptingBinding(guard_module.ADMISSION))
                          if step == "reset"
                          else mock.patch.object(call_lock_module, "fcntl",
                                                 InterruptingUnlock(call_lock_module.fcntl)))
                with target, self.assertRaises(KeyboardInterrupt):
                    call(guard, Tool(), "c1")
                self.assertEqual(held_calls(self.data_dir), [])
                self.assertEqual(call(guard, Tool(), "c2"), '{"status": "booked"}')


class InterruptAfterAdmission(ProtectedCallCase):
    """A KeyboardInterrupt between admission and the binding: the tool never
    runs, the operation stays open with its owner gone, and no lock leaks."""

    def test_interrupt_before_the_binding_releases_everything(self):
        guard = RecoveryGuard(self.data_dir)
        tool = Tool()
        with mock.patch.object(guard_module, "Admission", side_effect=KeyboardInterrupt):
            with self.assertRaises(KeyboardInterrupt):
                self.call(guard, tool)
        self.assertEqual(tool.calls, 0)
        [operation] = guard.gate.opened_journal.unresolved()
        self.assertEqual(operation.state, "pending")
        self.assertEqual(probe_owner(self.data_dir, operation.operation_id)["owner"], "gone")
        # Neither a lock nor a binding leaked: the retry meets the gate.
        self.assertEqual(self.blocked_code(self.call(guard, tool)), "unresolved_operations")
        self.assertEqual(tool.calls, 0)
        guard.close()
        self.assertVerifies()


if __name__ == "__main__":
    unittest.main()
