"""What a run costs the machine: memory, CPU, GPU, and the time to its first result.

`ResourceProbe.sample()` is called once per update, when the update's record
is made (never inside a rollout or a learning epoch), and returns the figures
that go into the record under "resources" (metrics.jsonl, the dashboard's
metrics.bin, TensorBoard):

* ``peak_rss_mb``: the trainer process's peak resident memory, MiB (Linux:
  VmHWM of /proc/self/status; elsewhere getrusage's ru_maxrss).
* ``processes``: the peak RSS of every process the trainer started and that
  is still alive (Multiprocessing env workers, the train.overlap actor and
  its workers, torch.compile's workers), keyed "NAME PID", found through
  /proc/PID/task/*/children (Linux only); ``peak_rss_total_mb`` adds them to
  the trainer's. Each figure is that process's own peak, so the total is an
  upper bound of the run's peak footprint (the peaks need not coincide).
  With several data-parallel ranks, rank 0's record also holds
  ``ranks_peak_rss_mb`` (every rank's process) and the total covers every
  rank's process tree (train/distributed.py carries them in the update's
  one all-reduce).
* ``cpu_percent``: CPU seconds of the trainer and its child processes over
  the wall seconds since the previous sample, x100 (200 = two cores busy).
* ``gpu_util_percent``, ``gpu_memory_mb``: on a CUDA device, NVML's
  utilisation of the trainer's GPU (the share of the last sample period in
  which a kernel ran) and the memory in use on it (every process's), through
  ``nvidia-ml-py`` (the optional ``nvml`` extra). Absent without a CUDA
  device or without NVML; an NVML failure turns them off, never the run.
* ``time_to_first_result``: seconds from the start of this process (the
  kernel's start time; Linux /proc, else psutil if installed) to the first
  update's record; the same value in every later record.

Cost: a few file reads of /proc per sample, tens of microseconds
(benchmarks/test_bench_suite.py, ``test_resource_sample``).
"""
from __future__ import annotations

import os
import sys
import time

MIB = 2.0 ** 20
REFRESH_CHILDREN_SECONDS = 5.0   # how often the list of child processes is re-read


# ---- this process and its children (Linux /proc; getrusage elsewhere) ----------------
def _status_kib(pid, key: bytes) -> float | None:
    """A "kB" line of /proc/PID/status (e.g. b"VmHWM"), in KiB."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(key + b":"):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_rss_mb(pid="self") -> float | None:
    """Peak resident memory of process `pid` (default this one) in MiB; None if unknown."""
    kib = _status_kib(pid, b"VmHWM")
    if kib is not None:
        return kib / 1024.0
    if pid != "self":
        return None
    try:
        import resource
    except ImportError:     # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / MIB if sys.platform == "darwin" else peak / 1024.0   # bytes on macOS, KiB else


def _stat_fields(pid) -> list[bytes] | None:
    """/proc/PID/stat after the command name (field 3 onwards)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_seconds(pid) -> float | None:
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def _name(pid) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip() or "process"
    except OSError:
        return "process"


def child_pids(pid=None) -> list[int]:
    """Every live descendant of `pid` (default this process), depth first; [] where the
    kernel does not list children (not Linux, or no CONFIG_PROC_CHILDREN)."""
    found, stack = [], [os.getpid() if pid is None else pid]
    while stack:
        parent = stack.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children", "rb") as handle:
                    children = [int(c) for c in handle.read().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                if child not in found:
                    found.append(child)
                    stack.append(child)
    return found


def process_start_time() -> float | None:
    """Unix time this process started; None if the platform does not say."""
    fields = _stat_fields("self")
    if fields is not None:
        try:
            with open("/proc/uptime", "rb") as handle:
                uptime = float(handle.read().split()[0])
            age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")   # field 22: starttime
            return time.time() - age
        except (OSError, ValueError, IndexError):
            pass
    try:
        import psutil
        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - not installed, or no permission: the figure is absent
        return None


# ---- the GPU (NVML) ---------------------------------------------------------------------
class NvmlDevice:
    """NVML's view of one CUDA device, or `.error` saying why there is none."""

    def __init__(self, device_index: int):
        self.handle = None
        self.error = None
        try:
            import pynvml   # nvidia-ml-py
        except ImportError:
            self.error = "nvidia-ml-py is not installed (pip install peregrine-rl[nvml])"
            return
        try:
            pynvml.nvmlInit()
            self.handle = self._handle(pynvml, device_index)
            self.nvml = pynvml
        except Exception as error:  # noqa: BLE001 - NVMLError and friends: no GPU figures
            self.handle, self.error = None, f"NVML unavailable: {error}"

    @staticmethod
    def _handle(pynvml, device_index: int):
        """The device torch calls cuda:`device_index` (by UUID, since CUDA_VISIBLE_DEVICES
        renumbers torch's devices but not NVML's), else NVML's device of that index."""
        try:
            import torch
            uuid = str(torch.cuda.get_device_properties(device_index).uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # noqa: BLE001 - older torch, or no CUDA here (a stand-in NVML)
            return pynvml.nvmlDeviceGetHandleByIndex(device_index)

    def sample(self) -> dict:
        if self.handle is None:
            return {}
        try:
            utilization = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
            return {"gpu_util_percent": float(utilization.gpu),
                    "gpu_memory_mb": float(memory.used) / MIB}
        except Exception as error:  # noqa: BLE001 - the GPU figures stop; training goes on
            self.handle, self.error = None, f"NVML failed: {error}"
            return {}


# ---- the probe ------------------------------------------------------------------------
class ResourceProbe:
    """Samples the figures of the module docstring; `device` is the trainer's torch
    device (GPU figures only for CUDA)."""

    def __init__(self, device=None):
        self.pid = os.getpid()
        self.started = process_start_time()
        self.time_to_first_result = None
        kind, _, number = str(device).partition(":")   # torch.device or "cuda", "cuda:1"
        self.gpu = NvmlDevice(int(number) if number.isdigit() else 0) if kind == "cuda" else None
        self._children: list[int] = []
        self._children_at = -float("inf")
        self._last_wall = time.perf_counter()
        self._last_cpu = self._tree_cpu()

    def _child_list(self) -> list[int]:
        now = time.monotonic()
        if now - self._children_at > REFRESH_CHILDREN_SECONDS:
            self._children, self._children_at = child_pids(self.pid), now
        return self._children

    def _tree_cpu(self) -> dict:
        """CPU seconds so far of this process and of each known child process."""
        seconds = {self.pid: time.process_time()}
        for pid in self._child_list():
            cpu = _cpu_seconds(pid)
            if cpu is not None:
                seconds[pid] = cpu
        return seconds

    def sample(self) -> dict:
        """The figures now (CPU over the time since the previous sample)."""
        wall = time.perf_counter()
        cpu = self._tree_cpu()
        # A child first seen in this sample counts from now on, not with its whole past.
        used = sum(seconds - self._last_cpu.get(pid, seconds) for pid, seconds in cpu.items())
        elapsed = wall - self._last_wall
        self._last_wall, self._last_cpu = wall, cpu
        own = peak_rss_mb()
        processes = {}
        for pid in self._children:
            peak = peak_rss_mb(pid)
            if peak is not None:
                processes[f"{_name(pid)} {pid}"] = peak
        figures = {"peak_rss_mb": own,
                   "peak_rss_total_mb": None if own is None else own + sum(processes.values()),
                   "cpu_percent": 100.0 * used / elapsed if elapsed > 0 else None}
        if processes:
            figures["processes"] = processes
        if self.gpu is not None:
            figures.update(self.gpu.sample())
        if self.time_to_first_result is None and self.started is not None:
            self.time_to_first_result = time.time() - self.started
        figures["time_to_first_result"] = self.time_to_first_result
        return figures


def merge_ranks(figures: dict, ranks: list[tuple[float, float]]) -> dict:
    """Rank 0's figures with every rank's (peak RSS, peak RSS of its process tree):
    `ranks_peak_rss_mb` and a total over every rank's tree."""
    merged = dict(figures)
    merged["ranks_peak_rss_mb"] = [peak for peak, _ in ranks]
    merged["peak_rss_total_mb"] = sum(total for _, total in ranks)
    return merged
