"""Two real processes with jax.distributed, 2 CPU devices each, in the
outfeed mode (below)."""

import json
import os
import socket
import subprocess
import sys

WORKER = os.path.join(os.path.dirname(__file__), "multiprocess_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run_two_processes(transport):
  port = str(_free_port())
  # The outfeed mode: the worker's last tap raises, which in the synchronous
  # mode would fail one process's part of a computation the other waits on.
  env = {**os.environ, "JAX_HOST_CALLBACK_TRANSPORT": transport,
         "JAX_HOST_CALLBACK_OUTFEED": "1"}
  env.pop("XLA_FLAGS", None)
  processes = [subprocess.Popen([sys.executable, WORKER, str(i), port],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env) for i in range(2)]
  results = []
  try:
    for process in processes:
      out, err = process.communicate(timeout=90)
      lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
      assert process.returncode == 0 and lines, err[-3000:]
      results.append(json.loads(lines[0][len("RESULT "):]))
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
  return results


def test_each_process_receives_its_own_devices_callbacks(transport):
  first, second = _run_two_processes(transport)
  d0, d1 = first["local"]
  d2, d3 = second["local"]
  assert first["all"] == second["all"] == [d0, d1, d2, d3]
  whole = [0.0, 1.0, 2.0, 3.0]
  # Partitioned taps and calls: each device's own shard, in its process.
  assert first["log"] == sorted([
      ["pmap", d0, 0.0], ["pmap", d1, 1.0],
      ["jit0", d0, [0.0, 2.0, 4.0, 6.0]],
      ["part", d0, [0.0], 0], ["part", d1, [1.0], 1],
      ["pcall", d0, [0.0], 0], ["pcall", d1, [1.0], 1]])
  assert second["log"] == sorted([
      ["pmap", d2, 10.0], ["pmap", d3, 11.0],
      ["jit3", d3, [0.0, 2.0, 4.0, 6.0]], ["call", d3, whole],
      ["part", d2, [2.0], 2], ["part", d3, [3.0], 3],
      ["pcall", d2, [2.0], 2], ["pcall", d3, [3.0], 3]])
  # The call's whole result reaches both processes' shards.
  assert first["shards"] == second["shards"] == [[1.0, 2.0, 3.0, 4.0]] * 2
  # A partitioned call: each device gets back its own shard of the result.
  assert first["partitioned_shards"] == [[0.0], [101.0]]
  assert second["partitioned_shards"] == [[202.0], [303.0]]
  assert first["raised"] is None
  assert second["raised"] == "raised on the last device"
