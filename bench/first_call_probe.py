"""A fresh process that makes its first protected call, and nothing else.

first_call_vs_verify.py times this whole process against a whole
``operator_cli.py verify`` process: both then hold an interpreter's start-up,
the product's imports and one verification of the live history, and neither
the benchmark's own modules.  argv: ``DATA_DIR TOOL_NAME ARGS_JSON``; the
product is loaded as product.py loads it (``host/standalone.py`` of this
checkout, or of ``$CRASH_RECOVERY_BENCH_PRODUCT_ROOT``).  Prints one JSON
line: ``import_seconds`` and ``first_call_seconds`` (building the guard to the
call's return); exits 1 when the call was refused.
"""
import json
import os
import runpy
import sys
import time


def main() -> int:
    began = time.perf_counter()
    data_dir, tool_name, args_text = sys.argv[1:4]
    root = (os.environ.get("CRASH_RECOVERY_BENCH_PRODUCT_ROOT")
            or os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    guard_module = runpy.run_path(os.path.join(root, "host", "standalone.py"))["load_module"]("guard")
    imported = time.perf_counter()
    guard = guard_module.RecoveryGuard(data_dir)
    result = guard.tool_execution(tool_name, json.loads(args_text), lambda: "done",
                                  session_id="bench-session", tool_call_id="bench-first-call")
    called = time.perf_counter()
    guard.close()
    print(json.dumps({"import_seconds": round(imported - began, 4),
                      "first_call_seconds": round(called - imported, 4)}))
    if result != "done":
        print(f"the first call was refused: {str(result)[:500]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
