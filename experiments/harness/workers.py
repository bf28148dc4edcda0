"""Evaluation spread over worker processes (`experiment.workers`).

At many questions in flight one event loop is CPU-bound: LangGraph, the openai SDK, scoring and
pydantic cost ~13 ms of CPU per question, so at 64 in flight against a 200 ms model the harness
alone needs more CPU than the model's latency leaves (bench `concurrency`). With N workers the
questions of each repeat are answered by N processes, each with its share of
`experiment.concurrency` in flight.

Who does what:
- The parent keeps everything that must stay single: the journal, the row cache, the trace
  writer, the progress bar and the row order (dataset order). It hands out cases one at a time,
  to whichever worker has a free slot (a worker's slots are its share of the concurrency), so
  exactly `experiment.concurrency` questions are in flight and a slower worker simply gets fewer.
- A worker builds its own components from the resolved config (the parent already ingested the
  index: workers only open it; they never log to MLflow), answers each case it is given exactly as
  the single-process evaluator would (`Evaluator.run_case`) and sends the case's rows back as the
  case ends (as JSON, each `QuestionRow` whole). The LLM response cache is one SQLite file in WAL
  mode with a busy timeout, which several processes may read and write at once (each reply is one
  INSERT in its own transaction).

Workers are forked from a clean server process (multiprocessing's `forkserver`, started at the
beginning of the run with the heavy modules imported once), never from the harness itself: a
process forked after Chroma is open hangs on its first query (Chroma's native threads do not
exist in the child), so nothing that has opened a store or a model may be forked.

Failures: a question that fails inside a worker is a failed row, as in one process. A worker that
dies (kill -9, OOM) stops the run with an error naming the worker and its exit code; the cases
it and the others finished are already journaled, the rest are asked on resume. The parent
stops its workers however the run ends (Ctrl-C included; workers ignore SIGINT and wait to be
told), and a worker whose parent dies sees its pipe close and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from caprag.errors import CapragError
from caprag.secrets import install_log_redaction
from experiments.harness.data import Dataset, EvalCase
from experiments.harness.evaluate import Evaluator
from experiments.results.row import ROWS, QuestionRow
from experiments.results.spawn import main_not_imported

AUTO = "auto"
AUTO_MIN_CONCURRENCY = 16
"""`auto` uses one process below this many questions in flight. Measured against the 200 ms stub
(bench `concurrency`, 2 cores): one event loop stays near the ideal up to 8 in flight (1.09x at 4,
1.21x at 8), where two workers gain nothing and cost their start-up (0.3-0.6 s per run: fork,
open the index, build the client) and memory (each its own index and models). From 16 on one
loop falls behind (1.35-1.47x at 16, 2.4x at 32), while two workers answer at 16 in ~1.17x of
the ideal once started."""
AUTO_PER_WORKER = 8
"""`auto` gives each worker at least this many questions in flight (16 -> 2, 64 -> up to 8),
at most one worker per usable core: a worker is one CPU-bound event loop."""

PRELOAD = ("experiments.harness.worker_preload",)
"""What the fork server imports once, so that a worker starts with it loaded."""
STOP_TIMEOUT_S = 30.0
"""How long a worker told to stop may take before it is terminated."""


class WorkerError(CapragError):
    """A worker process died or could not run its questions."""


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_count(cfg: DictConfig) -> int:
    """Processes that answer the questions: experiment.workers, `auto` resolved, never more than
    the questions in flight (a worker has at least one)."""
    wanted = OmegaConf.select(cfg, "experiment.workers", default=AUTO)
    concurrency = max(1, int(cfg.experiment.concurrency))
    if wanted == AUTO:
        if concurrency < AUTO_MIN_CONCURRENCY:
            return 1
        wanted = min(usable_cores(), concurrency // AUTO_PER_WORKER)
    return max(1, min(int(wanted), concurrency))


def shares(concurrency: int, count: int) -> list[int]:
    """Each worker's questions in flight: the concurrency split as evenly as it goes."""
    return [concurrency // count + (number < concurrency % count) for number in range(count)]


def _context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def prepare(cfg: DictConfig) -> None:
    """Start the fork server now when this run will use workers: it imports the heavy modules
    (seconds of CPU) while the harness builds its components. A no-op once it runs."""
    if worker_count(cfg) > 1:
        _context()
        forkserver.ensure_running()


def _signal_name(code: int) -> str:
    with contextlib.suppress(ValueError):
        return f" (killed by {signal.Signals(-code).name})" if code < 0 else ""
    return ""


@dataclass
class Worker:
    """One worker process and the parent's ends of its two pipes."""

    number: int
    slots: int
    process: Any
    inbox: Connection
    """Parent -> worker: ("case", repeat, case id), or None to stop."""
    outbox: Connection
    """Worker -> parent: ("case", repeat, case id, the rows as JSON: `ROWS.dump_json`),
    ("failed", message), ("cpu", ...)."""
    error: str = ""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds the worker spent building its components, answering and in all, and the wall
    seconds until it was built (reported as it stops)."""

    @property
    def name(self) -> str:
        return f"worker {self.number + 1} (pid {self.process.pid})"

    def died(self, finished: int, total: int) -> WorkerError:
        """The error for a worker whose pipe closed while it had questions to answer."""
        self.process.join(10)
        code = self.process.exitcode
        ended = "is not responding" if code is None else f"ended with exit code {code}"
        cause = f": {self.error}" if self.error else _signal_name(code or 0)
        return WorkerError(
            f"{self.name} {ended}{cause}; the {finished} cases finished so far (of {total}) "
            "are kept: run the same command again (experiment.resume=auto) to ask only the "
            "others"
        )


class _Lost(Exception):
    """A worker's pipe closed while it had questions to answer (made a WorkerError by `run`)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(worker.name)
        self.worker = worker


class WorkerPool:
    """N worker processes for one run; `run` answers one repeat's cases with them."""

    def __init__(
        self, config: Mapping[str, Any], count: int, concurrency: int, *, progress: bool = False
    ) -> None:
        context = _context()
        self.progress = progress
        self.workers: list[Worker] = []
        self._stopped = False
        try:
            for number, slots in enumerate(shares(concurrency, count)):
                worker_in, inbox = context.Pipe(duplex=False)
                outbox, worker_out = context.Pipe(duplex=False)
                process = context.Process(
                    target=serve,
                    args=(
                        config,
                        dict(os.environ),
                        logging.getLogger().level,
                        worker_in,
                        worker_out,
                    ),
                    name=f"caprag-worker-{number + 1}",
                    daemon=True,
                )
                with main_not_imported():
                    process.start()
                # Only the worker holds its ends: its death closes the pipe for the parent.
                worker_in.close()
                worker_out.close()
                self.workers.append(Worker(number, slots, process, inbox, outbox))
        except BaseException:
            self.close(graceful=False)
            raise

    async def run(
        self,
        dataset: Dataset,
        *,
        done: Mapping[int, Mapping[str, list[QuestionRow]]],
        on_case: Callable[[int, EvalCase, list[QuestionRow]], None],
        repeats: Sequence[int] = (0,),
    ) -> list[QuestionRow]:
        """All rows of every repeat, in repeat then dataset order, like `Evaluator.run`: cases
        in `done` (by repeat, then case id) are not asked again, each other case goes to a
        worker with a free slot (the repeats share the slots: none idles between repeats) and
        `on_case` sees it, with its repeat, as its rows come back."""
        loop = asyncio.get_running_loop()
        pending = {
            (repeat, case.id): case
            for repeat in repeats
            for case in dataset.cases
            if case.id not in done.get(repeat, {})
        }
        found: dict[tuple[int, str], list[QuestionRow]] = {}
        free: asyncio.Queue[Worker] = asyncio.Queue()
        for slot in range(max(w.slots for w in self.workers)):
            for worker in self.workers:
                if slot < worker.slots:
                    free.put_nowait(worker)
        outcome: asyncio.Future[None] = loop.create_future()
        bar = tqdm(
            total=dataset.questions * len(repeats),
            unit="q",
            desc="questions",
            disable=not self.progress,
        )
        kept = 0
        for repeat in repeats:
            known = done.get(repeat, {})
            bar.update(sum(len(known[c.id]) for c in dataset.cases if c.id in known))
            kept += sum(1 for case in dataset.cases if case.id in known)

        def stop(error: BaseException | None) -> None:
            if not outcome.done():
                if error is None:
                    outcome.set_result(None)
                else:
                    outcome.set_exception(error)

        def lost(worker: Worker) -> None:
            # The error is worded once the loop is back here: a case that another worker
            # finishes meanwhile is still journaled, and the message counts it.
            stop(_Lost(worker))

        def readable(worker: Worker) -> None:
            try:
                message = worker.outbox.recv()
            except (EOFError, OSError):
                loop.remove_reader(worker.outbox.fileno())
                lost(worker)
                return
            try:
                if message[0] == "failed":
                    worker.error = message[1]
                    return  # the pipe closes next: reported with the exit code
                _kind, repeat, case_id, payload = message
                rows = ROWS.validate_json(payload)
                case = pending[(repeat, case_id)]
                on_case(repeat, case, rows)
                found[(repeat, case_id)] = rows
                bar.update(len(rows))
                free.put_nowait(worker)
                if len(found) == len(pending):
                    stop(None)
            except BaseException as exc:  # a journal that cannot be written stops the run
                stop(exc)

        for worker in self.workers:
            loop.add_reader(worker.outbox.fileno(), readable, worker)
        try:
            if not pending:
                stop(None)
            for (repeat, case_id), _case in pending.items():
                waiting = asyncio.ensure_future(free.get())
                await asyncio.wait((waiting, outcome), return_when=asyncio.FIRST_COMPLETED)
                if not waiting.done():
                    waiting.cancel()
                    break
                worker = waiting.result()
                try:
                    worker.inbox.send(("case", repeat, case_id))
                except OSError:  # it died before its pipe said so
                    lost(worker)
                    break
            try:
                await outcome
            except _Lost as gone:
                total = len(dataset.cases) * len(repeats)
                raise gone.worker.died(kept + len(found), total) from None
        finally:
            for worker in self.workers:
                with contextlib.suppress(ValueError, OSError):  # closed by a dead worker
                    loop.remove_reader(worker.outbox.fileno())
            bar.close()
        rows = [
            found.get((repeat, case.id)) or done[repeat][case.id]
            for repeat in repeats
            for case in dataset.cases
        ]
        return [row for case_rows in rows for row in case_rows]

    def close(self, *, graceful: bool = True) -> None:
        """Stop the workers: told to stop (and their CPU time read) when the run went well,
        terminated otherwise; none is left running."""
        if self._stopped:
            return
        self._stopped = True
        deadline = time.monotonic() + STOP_TIMEOUT_S
        if graceful:
            for worker in self.workers:
                with contextlib.suppress(OSError):
                    worker.inbox.send(None)
            for worker in self.workers:
                with contextlib.suppress(EOFError, OSError):
                    while worker.outbox.poll(max(0.0, deadline - time.monotonic())):
                        message = worker.outbox.recv()
                        if message[0] == "cpu":
                            worker.cpu_s = message[1]
                            break
        for worker in self.workers:
            if graceful:
                worker.process.join(max(0.0, deadline - time.monotonic()))
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join(10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(10)
            worker.inbox.close()
            worker.outbox.close()


@contextlib.contextmanager
def pool(cfg: DictConfig, config: Mapping[str, Any]) -> Iterator[WorkerPool | None]:
    """The run's workers (None: answer in this process), stopped however the run ends."""
    count = worker_count(cfg)
    if count <= 1:
        yield None
        return
    workers = WorkerPool(
        config, count, int(cfg.experiment.concurrency), progress=bool(cfg.experiment.progress)
    )
    try:
        yield workers
    except BaseException:
        workers.close(graceful=False)
        raise
    workers.close()


# --- in the worker process ----------------------------------------------------------------------


def serve(
    config: Mapping[str, Any],
    environ: dict[str, str],
    log_level: int,
    inbox: Connection,
    outbox: Connection,
) -> None:
    """A worker's life: build the components, answer the cases it is sent until told to stop
    (or until the parent is gone), then report its CPU time."""
    started = time.monotonic()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops us
    os.environ.clear()
    os.environ.update(environ)  # the fork server's environment is the one it started with
    # The parent's verbosity, to stderr (an import in the fork server, wordllama's, set the root
    # logger to INFO, which would print every HTTP request).
    logging.basicConfig(level=log_level or logging.WARNING, force=True)
    install_log_redaction()
    try:
        asyncio.run(_answer(config, inbox, outbox, started))
    except Exception as exc:
        with contextlib.suppress(OSError):
            outbox.send(("failed", f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    # Nothing is left to write (each reply was committed to the cache as it came), so skip the
    # interpreter's teardown of some 3,700 modules, which the parent would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def worker_config(config: Mapping[str, Any]) -> DictConfig:
    """The run's config as a worker builds from it: the index is opened, not ingested."""
    cfg = OmegaConf.create(dict(config))
    cfg.retriever.index.ingest = False
    cfg.retriever.index.progress = False
    cfg.experiment.progress = False
    return cfg


async def _answer(
    config: Mapping[str, Any], inbox: Connection, outbox: Connection, started: float
) -> None:
    from experiments.harness.build import build_components, repeat_evaluator

    cfg = worker_config(config)
    parts = build_components(cfg)
    built, built_wall = time.process_time(), time.monotonic() - started
    cases = {case.id: case for case in parts.dataset.cases}
    evaluators: dict[int, Evaluator] = {}
    gc.freeze()  # what is built now lives as long as the worker (see Evaluator.run)
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[bool] = loop.create_future()
    """True when the parent said stop, False when its pipe closed (it is gone)."""
    tasks: set[asyncio.Task[None]] = set()

    def evaluator(repeat: int) -> Evaluator:
        if repeat not in evaluators:
            evaluators[repeat] = repeat_evaluator(cfg, parts, repeat)
        return evaluators[repeat]

    async def one(repeat: int, case_id: str) -> None:
        try:
            rows = await evaluator(repeat).run_case(cases[case_id], None, repeat)
            outbox.send(("case", repeat, case_id, ROWS.dump_json(rows)))
        except Exception as exc:
            if not stopped.done():
                stopped.set_exception(exc)

    def readable() -> None:
        try:
            message = inbox.recv()
        except (EOFError, OSError):
            message = False
        if message is None or message is False:
            loop.remove_reader(inbox.fileno())
            if not stopped.done():
                stopped.set_result(message is None)
            return
        _kind, repeat, case_id = message
        task = loop.create_task(one(repeat, case_id))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    loop.add_reader(inbox.fileno(), readable)
    told = await stopped
    for task in tasks:
        task.cancel()
    if told:
        total = time.process_time()
        cpu = {"build": built, "answer": total - built, "total": total, "build_wall": built_wall}
        outbox.send(("cpu", cpu))
