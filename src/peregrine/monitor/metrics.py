"""The metrics file: one writer (the trainer), any number of readers.

The trainer publishes its latest statistics into ``RUN_DIR/metrics.bin``.
Publishing is a few `pwrite`s of a few hundred bytes into the file's pages in
the page cache, which every reader sees at once: no lock, no serialization, so
the trainer never waits on a reader, and a reader (the dashboard, in its own
process) can attach, detach or crash at any time without the trainer noticing.

Neither side maps the file. A memory map of a file that someone else truncates
(`truncate`, `cp other metrics.bin`, a log rotator) faults with SIGBUS on the
next touch of a page past the new end, which killed the trainer and any attached
monitor without a word. `pwrite`/`pread` cannot fault: the writer checks the
file before each record, and rewrites a file cut or overwritten in place (one
warning, training carries on), or warns once that it was renamed away; a reader
whose file is cut under it gets a MetricsFileError saying so.

File layout (little-endian, every offset fixed by the header)::

    offset  size  field
    0       8     magic  b"PGMETRIC"
    8       4     u32 version (FORMAT_VERSION)
    12      4     u32 header_size (bytes; records start here; multiple of 64)
    16      4     u32 num_fields (float64 values per record, env stats included)
    20      4     u32 num_env_stats (the last num_env_stats values of a record)
    24      4     u32 ring_capacity K (records kept)
    28      4     u32 record_size (bytes per record; multiple of 64)
    32      8     i64 pid of the writer
    40      8     f64 start time (Unix seconds)
    48      8     u64 count: records published so far (mutable)
    56      4     u32 names_length (bytes of the JSON block at offset 128)
    60      4     reserved (0)
    64      64    run id, UTF-8, NUL padded
    128     n     JSON {"fields": [...], "env_stats": [...], "host": "...", "world_size": N,
                        "total_steps": T}
    ...           zero padding up to header_size
    header_size + i * record_size: record slot i, for i in 0..K-1:
            8     u64 sequence (seqlock: odd while being written)
            8*F   f64 values, in the order of "fields" then "env_stats"

Fields are only ever appended (after "status"): a reader takes the names from
the JSON block, so a file written before a field existed reads with that
field missing, and an older reader ignores fields it does not know.

Publishing record number ``n`` (0-based) writes slot ``n % K``: bump that
slot's sequence to an odd value, copy the values, bump it to the next even
value, then set ``count = n + 1``. A reader reads ``count``, then the slot of
record ``count - 1``: sequence, values, sequence again, and keeps the values
only if both sequences are equal and even and the record's own ``index`` field
is ``count - 1`` (so a slot overwritten by a later lap is not mistaken for it);
otherwise it retries. A reader therefore never returns a torn record. The K
slots double as a short history (sparklines) at no extra cost.

Ordering: the sequence, the values and ``count`` are written by separate
system calls in program order, and a reader reads them by separate calls;
each call's copy completes before the next starts, which is what a seqlock
needs (a system call is a full barrier on every CPU Linux runs on).

The header is written to a temporary file that is renamed into place, so a
reader never sees a half-written header; the writer never changes the file's
size after that (it only restores it, see above).
"""
from __future__ import annotations

import json
import math
import os
import socket
import struct
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..files import written_atomically

MAGIC = b"PGMETRIC"
FORMAT_VERSION = 1
FILE_NAME = "metrics.bin"
DEFAULT_RING_CAPACITY = 256

_FIXED = struct.Struct("<8sIIIIIIqdQII")  # the first 64 bytes, up to and including the reserved word
_U64 = struct.Struct("<Q")
_COUNT_OFFSET = 48
_RUN_ID_OFFSET = 64
_RUN_ID_SIZE = 64
_NAMES_OFFSET = 128
_ALIGN = 64

# The values of a record, in order. Env statistics follow these.
FIELDS = (
    "index",            # record number (0-based); lets a reader detect a lapped slot
    "global_step",      # env steps (agent rows) collected so far
    "updates",          # optimizer updates (PPO iterations) done
    "sps",              # steps per second, as the trainer measures it
    "elapsed",          # seconds since training started
    "episodes",         # episodes finished so far
    "episode_return",   # mean return of recently finished episodes (NaN if none)
    "episode_length",   # mean length of recently finished episodes (NaN if none)
    "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "learning_rate",
    "time_env",         # seconds spent stepping envs (the trainer decides the window;
    #                     with vec.split = 2 the seconds it waited for them, train/run_log.py)
    "time_forward",     # seconds in policy forward passes during rollouts
    "time_learn",       # seconds in the PPO update
    "heartbeat",        # wall time (Unix seconds) of this record
    "status",           # STATUS_CODES
    "time_overlap",     # rollout seconds that ran beside learning (train.overlap), else NaN
    # What the run costs the machine (train/resources.py; NaN where unknown):
    "peak_rss_mb",          # the trainer process's peak resident memory, MiB
    "peak_rss_total_mb",    # the same summed over the run's processes (workers, ranks)
    "cpu_percent",          # CPU of the trainer and its children over the last update (100 = a core)
    "gpu_util_percent",     # NVML utilisation of the trainer's GPU (CUDA only)
    "gpu_memory_mb",        # NVML memory in use on that GPU, MiB
    "time_to_first_result", # seconds from process start to the first update's record
)
RESOURCE_NAMES = ("peak_rss_mb", "peak_rss_total_mb", "cpu_percent", "gpu_util_percent",
                  "gpu_memory_mb", "time_to_first_result")
LOSS_NAMES = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "learning_rate")
TIME_SPLIT_NAMES = ("env", "forward", "learn")
STATUS_NAMES = ("starting", "running", "finished", "interrupted", "crashed")
STATUS_CODES = {name: code for code, name in enumerate(STATUS_NAMES)}
FINAL_STATUSES = ("finished", "interrupted", "crashed")

_INDEX = {name: i for i, name in enumerate(FIELDS)}
_ROW_FIELDS = FIELDS[1:]        # what update() writes (index is _publish's)
_HEARTBEAT, _STATUS = _INDEX["heartbeat"], _INDEX["status"]
_EMPTY: dict = {}


class MetricsFileError(Exception):
    """The metrics file is missing, truncated, corrupt or not ours."""


def metrics_path(run_dir) -> Path:
    """`run_dir/metrics.bin`; a path to the file itself is returned unchanged."""
    path = Path(run_dir)
    return path if path.name == FILE_NAME or path.is_file() else path / FILE_NAME


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _print_warning(message: str) -> None:
    print(f"peregrine: warning: {message}", file=sys.stderr, flush=True)


def _check_name(kind: str, name) -> str:
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ValueError(f"{kind} names must be non-empty strings of at most 64 characters, got {name!r}")
    return name


class MetricsWriter:
    """Publishes training statistics into ``run_dir/metrics.bin``.

        writer = MetricsWriter(run_dir, env.stat_names)
        writer.update(global_step=..., sps=..., losses={...}, time_split={...})
        writer.close("finished")

    Missing values are stored as NaN (shown as "-" by the dashboard). Use it
    as a context manager to get ``close("crashed")`` on an exception and
    ``close("interrupted")`` on Ctrl-C. `warn(message)` is told, once each, when
    the file was cut or overwritten by someone else (it is then rewritten) or
    renamed away (records go on into the old file).
    """

    def __init__(self, run_dir, env_stat_names=(), run_id: str | None = None,
                 ring_capacity: int = DEFAULT_RING_CAPACITY, world_size: int = 1,
                 warn=_print_warning, total_steps: int | None = None):
        if isinstance(ring_capacity, bool) or not isinstance(ring_capacity, int) \
                or not 1 <= ring_capacity <= 1 << 20:
            raise ValueError(f"ring_capacity must be an int in [1, 1048576], got {ring_capacity!r}")
        self.env_stat_names = tuple(_check_name("env stat", n) for n in env_stat_names)
        if len(set(self.env_stat_names)) != len(self.env_stat_names):
            raise ValueError(f"env_stat_names has duplicates: {list(self.env_stat_names)}")
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / FILE_NAME
        self.run_id = run_id or self.run_dir.name or uuid.uuid4().hex[:12]
        self.ring_capacity = ring_capacity
        self.num_fields = len(FIELDS) + len(self.env_stat_names)
        self.start_time = time.time()

        names = json.dumps({"fields": list(FIELDS), "env_stats": list(self.env_stat_names),
                            "host": socket.gethostname(),
                            # ranks of a data-parallel run: sps and steps count them all
                            "world_size": int(world_size),
                            # the run's step budget (the dashboard's progress and time left)
                            "total_steps": None if total_steps is None else int(total_steps)}
                           ).encode()
        self.header_size = _round_up(_NAMES_OFFSET + len(names), _ALIGN)
        self.record_size = _round_up(8 + 8 * self.num_fields, _ALIGN)
        size = self.header_size + ring_capacity * self.record_size
        header = bytearray(self.header_size)
        _FIXED.pack_into(header, 0, MAGIC, FORMAT_VERSION, self.header_size, self.num_fields,
                         len(self.env_stat_names), ring_capacity, self.record_size, os.getpid(),
                         self.start_time, 0, len(names), 0)
        run_id_bytes = self.run_id.encode()[:_RUN_ID_SIZE]
        header[_RUN_ID_OFFSET:_RUN_ID_OFFSET + len(run_id_bytes)] = run_id_bytes
        header[_NAMES_OFFSET:_NAMES_OFFSET + len(names)] = names

        # Build the whole file under a temporary name, then rename it into
        # place: a reader sees either no file or a complete header.
        with written_atomically(self.path) as temporary:
            with open(temporary, "wb") as handle:
                handle.write(header)
                handle.truncate(size)
            self._file = open(temporary, "r+b")
        self._fd = self._file.fileno()
        self._header, self._size = bytes(header), size
        self._inode = os.fstat(self._fd).st_ino
        self._warn, self._warned = warn, set()
        self._sequences = np.zeros(ring_capacity, np.uint64)  # each slot's, as last written
        self._values = np.full(self.num_fields, np.nan)  # the record being built
        self._records = 0
        self.closed = False
        for counter in ("global_step", "updates", "elapsed", "episodes"):
            self._values[_INDEX[counter]] = 0.0
        self._values[_INDEX["status"]] = STATUS_CODES["starting"]
        self._values[_INDEX["heartbeat"]] = self.start_time
        self._publish()

    # ---- writing --------------------------------------------------------------
    def update(self, global_step=0, updates=0, sps=math.nan, elapsed=None, episodes=0,
               episode_return=math.nan, episode_length=math.nan, env_stats=None, losses=None,
               time_split=None, status="running", resources=None) -> None:
        """Publishes one record. Cost: a few microseconds (see benchmarks).
        `resources`: the record's figures named in RESOURCE_NAMES (train/resources.py)."""
        if self.closed:
            raise ValueError("update() on a closed MetricsWriter")
        if status not in STATUS_CODES:
            raise ValueError(f"status must be one of {list(STATUS_NAMES)}, got {status!r}")
        now = time.time()
        losses, time_split = losses or _EMPTY, time_split or _EMPTY
        resources = resources or _EMPTY
        # Every value by its name in FIELDS (losses and resources are keyed so already;
        # time_split's parts become time_<part>); the row is FIELDS[1:] in order (index
        # is set by _publish), written with one NumPy assignment. Absent: None -> NaN.
        values = {**losses, **resources, "global_step": global_step, "updates": updates,
                  "sps": sps, "elapsed": now - self.start_time if elapsed is None else elapsed,
                  "episodes": episodes, "episode_return": episode_return,
                  "episode_length": episode_length, "heartbeat": now,
                  "status": STATUS_CODES[status], "time_env": time_split.get("env"),
                  "time_forward": time_split.get("forward"),
                  "time_learn": time_split.get("learn"),
                  "time_overlap": time_split.get("overlap")}
        row = [values.get(name) for name in _ROW_FIELDS]
        if self.env_stat_names:
            env_stats = env_stats or _EMPTY
            row.extend(env_stats.get(name) for name in self.env_stat_names)
        try:
            self._values[1:] = row
        except (TypeError, ValueError):            # None or a non-number somewhere: NaN for it
            self._values[1:] = [_number(value) for value in row]
        self._publish()

    def heartbeat(self) -> None:
        """Republishes the last record with a fresh heartbeat (call during long phases)."""
        if not self.closed:
            self._values[_HEARTBEAT] = time.time()
            self._publish()

    def _publish(self) -> None:
        record = self._records
        slot = record % self.ring_capacity
        self._values[0] = record
        self._check_file()
        fd, offset = self._fd, self.header_size + slot * self.record_size
        sequence = int(self._sequences[slot])
        os.pwrite(fd, _U64.pack(sequence + 1), offset)      # odd: being written
        os.pwrite(fd, self._values.tobytes(), offset + 8)
        os.pwrite(fd, _U64.pack(sequence + 2), offset)      # even: consistent
        os.pwrite(fd, _U64.pack(record + 1), _COUNT_OFFSET)
        self._sequences[slot] = sequence + 2
        self._records = record + 1

    def _check_file(self) -> None:
        """Before a record: a file cut or overwritten in place is rewritten (its
        header, zeroed slots); one renamed away or deleted is left (a warning)."""
        if os.fstat(self._fd).st_size != self._size:
            self._warn_once("truncated", f"{FILE_NAME} was truncated or overwritten by another "
                            f"process; rewriting it (training is unaffected; the dashboard's "
                            f"history restarts)")
            os.ftruncate(self._fd, 0)           # no stale bytes of whatever was written
            os.ftruncate(self._fd, self._size)
            os.pwrite(self._fd, self._header, 0)
            self._sequences[:] = 0
        if "replaced" not in self._warned:
            try:
                replaced = os.stat(self.path).st_ino != self._inode
            except OSError:
                replaced = True
            if replaced:
                self._warn_once("replaced", f"{FILE_NAME} was replaced by another file or "
                                f"deleted; this run's records go on into the old one, which a "
                                f"dashboard attached from now on does not see")

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            self._warn(message)

    def close(self, status: str = "finished") -> None:
        """Publishes a final record with `status` and unmaps the file. Idempotent."""
        if self.closed:
            return
        if status not in FINAL_STATUSES:
            raise ValueError(f"close status must be one of {list(FINAL_STATUSES)}, got {status!r}")
        self._values[_HEARTBEAT] = time.time()
        self._values[_STATUS] = STATUS_CODES[status]
        try:
            self._publish()
        finally:
            self.closed = True
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if kind is None:
            self.close("finished")
        elif issubclass(kind, KeyboardInterrupt):
            self.close("interrupted")
        else:
            self.close("crashed")
        return False


def _number(value) -> float:
    if value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


# ---- reading --------------------------------------------------------------------
@dataclass
class Header:
    version: int
    num_fields: int
    env_stat_names: tuple[str, ...]
    ring_capacity: int
    pid: int
    start_time: float
    run_id: str
    host: str
    fields: tuple[str, ...]
    world_size: int = 1      # ranks of a data-parallel run (absent in older files: 1)
    total_steps: int | None = None    # the run's step budget (absent in older files)


@dataclass
class Record:
    """One consistent record. `values` maps every field name to its float."""

    values: dict[str, float]
    env_stats: dict[str, float] = field(default_factory=dict)

    def __getitem__(self, name: str) -> float:
        return self.values[name]

    @property
    def status(self) -> str:
        code = self.values["status"]
        return STATUS_NAMES[int(code)] if code == code and 0 <= code < len(STATUS_NAMES) else "unknown"


class MetricsReader:
    """Reads ``metrics.bin`` (given the run directory or the file) from any process.

    Raises MetricsFileError with a message fit for a user when the file is
    missing, truncated, corrupt or was written by something else.
    """

    def __init__(self, run_dir_or_file, timeout: float = 2.0):
        self.path = metrics_path(run_dir_or_file)
        self.timeout = timeout
        try:
            handle = open(self.path, "rb")
        except FileNotFoundError:
            raise MetricsFileError(f"no metrics file at {self.path} (is this a run directory?)") from None
        except OSError as error:
            raise MetricsFileError(f"cannot open {self.path}: {error.strerror}") from None
        self._file, self._fd = handle, handle.fileno()
        try:
            status = os.fstat(handle.fileno())
            size, self.inode = status.st_size, status.st_ino
            if size < _NAMES_OFFSET:
                raise MetricsFileError(f"{self.path} is truncated ({size} bytes) or not a Peregrine metrics file")
            self.header = self._parse_header(size)
        except BaseException:
            handle.close()
            raise
        self._num_fixed = len(self.header.fields)

    def _pread(self, size: int, offset: int) -> bytes:
        """`size` bytes at `offset`; MetricsFileError if the file no longer has them
        (cut while we read it: reading never faults, unlike a memory map)."""
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise MetricsFileError(f"{self.path} is truncated: it was cut to "
                                   f"{os.fstat(self._fd).st_size} bytes while being read")
        return data

    def _u64(self, offset: int) -> int:
        return _U64.unpack(self._pread(8, offset))[0]

    def _parse_header(self, size: int) -> Header:
        (magic, version, header_size, num_fields, num_env_stats, ring_capacity, record_size, pid,
         start_time, _count, names_length, _reserved) = _FIXED.unpack(self._pread(_FIXED.size, 0))
        if magic != MAGIC:
            raise MetricsFileError(f"{self.path} is not a Peregrine metrics file (bad magic {magic!r})")
        if version != FORMAT_VERSION:
            raise MetricsFileError(f"{self.path} has format version {version}; this Peregrine reads "
                                   f"version {FORMAT_VERSION}")
        problems = []
        if header_size % _ALIGN or header_size < _NAMES_OFFSET + names_length:
            problems.append(f"header_size {header_size}")
        if not 1 <= ring_capacity <= 1 << 20:
            problems.append(f"ring_capacity {ring_capacity}")
        if record_size % _ALIGN or record_size < 8 + 8 * num_fields or num_fields < num_env_stats:
            problems.append(f"record_size {record_size} for {num_fields} fields")
        if problems:
            raise MetricsFileError(f"{self.path} is corrupt: bad {', '.join(problems)}")
        expected = header_size + ring_capacity * record_size
        if size < expected:
            raise MetricsFileError(f"{self.path} is truncated: {size} bytes, the header promises {expected}")
        try:
            names = json.loads(self._pread(names_length, _NAMES_OFFSET).decode())
            fields = tuple(names["fields"])
            env_stats = tuple(names["env_stats"])
            host = str(names.get("host", ""))
            world_size = int(names.get("world_size", 1))
            total_steps = names.get("total_steps")
            total_steps = int(total_steps) if isinstance(total_steps, int) else None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise MetricsFileError(f"{self.path} is corrupt: unreadable field names") from None
        if len(fields) + len(env_stats) != num_fields or len(env_stats) != num_env_stats \
                or fields[:len(FIELDS)] != FIELDS[:len(fields)] or "status" not in fields:
            raise MetricsFileError(f"{self.path} is corrupt: field names do not match the record layout")
        run_id = self._pread(_RUN_ID_SIZE, _RUN_ID_OFFSET).rstrip(b"\0")
        self._header_size, self._record_size = header_size, record_size
        return Header(version, num_fields, env_stats, ring_capacity, pid, start_time,
                      run_id.decode(errors="replace"), host, fields, world_size, total_steps)

    @property
    def count(self) -> int:
        """Records published so far."""
        return self._u64(_COUNT_OFFSET)

    def _read_record(self, number: int):
        """The values of record `number`, or None if its slot was overwritten."""
        slot = number % self.header.ring_capacity
        offset = self._header_size + slot * self._record_size
        size = 8 * self.header.num_fields
        deadline = None
        tries = 0
        stuck_at = -1
        while True:
            before = self._u64(offset)
            if not before & 1:                 # odd: the writer is in the middle of it
                values = np.frombuffer(self._pread(size, offset + 8), np.float64)
                if self._u64(offset) == before:
                    # consistent; but is it still the record we were asked for?
                    return values if values[0] == number else None
            tries += 1
            if before != stuck_at:             # the writer moved on: it is alive, keep trying
                stuck_at, deadline = before, None
            if tries % 64 == 0:
                # The writer may have been descheduled mid-record: back off
                # rather than spin; give up only after `timeout` seconds
                # without any progress.
                now = time.monotonic()
                deadline = deadline or now + self.timeout
                if now > deadline:
                    raise MetricsFileError(f"{self.path}: no consistent record in {self.timeout:g} s "
                                           "(the writer is stuck mid-record)")
                time.sleep(0.0002)

    def _to_record(self, values) -> Record:
        fixed = self._num_fixed
        return Record(dict(zip(self.header.fields, values[:fixed].tolist())),
                      dict(zip(self.header.env_stat_names, values[fixed:].tolist())))

    def read(self) -> Record | None:
        """The latest record (None before the first one)."""
        deadline = time.monotonic() + self.timeout
        last_count = self.count
        while True:
            count = self.count
            if count == 0:
                return None
            values = self._read_record(count - 1)
            if values is not None:
                return self._to_record(values)
            # The slot holds another record: the writer published again
            # meanwhile (read the newer one), or the file is damaged (the
            # count stays put and the slot never matches).
            if count != last_count:
                last_count, deadline = count, time.monotonic() + self.timeout
            elif time.monotonic() > deadline:
                raise MetricsFileError(f"{self.path} is corrupt: record {count - 1} is not in its slot")
            time.sleep(0.0001)

    def history(self, limit: int | None = None) -> list[Record]:
        """Up to `limit` most recent records, oldest first (the ring's contents)."""
        count = self.count
        depth = min(count, self.header.ring_capacity, limit or self.header.ring_capacity)
        records = []
        for number in range(count - depth, count):
            values = self._read_record(number)
            if values is not None:
                records.append(self._to_record(values))
        return records

    def liveness(self, record: Record | None = None, stale_after: float = 10.0) -> str:
        """'running', 'stale', 'silent' or the final status.

        'stale': the record says running but the writer's process is gone (or,
        for a run on another host, no heartbeat for `stale_after` s).
        'silent': the process exists but has not published for `stale_after` s.
        """
        record = record if record is not None else self.read()
        if record is None:
            return "starting" if pid_alive(self.header.pid) else "stale"
        status = record.status
        if status in FINAL_STATUSES:
            return status
        age = time.time() - record["heartbeat"]
        if self.header.host and self.header.host != socket.gethostname():
            return "stale" if age > stale_after else status
        if not pid_alive(self.header.pid):
            return "stale"
        return "silent" if age > stale_after else status

    def close(self) -> None:
        if getattr(self, "_file", None) is not None:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def pid_alive(pid: int) -> bool:
    """True if a process `pid` exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:  # a zombie has exited; only its parent has not collected it yet
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True
