"""Which queued items go into the next forward pass: fair between requests, with full batches.

First come, first served across items lets one bulk request (1,024 passages) hold every later request
behind it for its whole duration. Here each batch starts from a *head* job and is filled from the others:

1. **Head**: the job with the best ``priority`` (lower first, as vLLM), then the least work left
   (tokens not yet scheduled, by :func:`size_class`: within a factor of two counts as equal), then the
   earliest: shortest remaining processing time first, which minimizes mean latency, and first come,
   first served among jobs of one size. A 1-text request goes before every longer one, so it waits for at most
   the batch in flight, even under many concurrent bulk requests. (Least *attained* service was tried
   first: it serves every new job's first batch in arrival order, so under 64 mixed clients a 1-text
   request waited behind ~40 first batches, p50 35 s in ``eval/benchmarks/load.py``.)
2. **Starvation guard**: at most once every ``starve_after + 1`` batches, the oldest job that was passed
   over for ``starve_after`` batches in a row becomes the head, so bulk jobs keep advancing under a
   stream of small ones while small ones still get most batches. (Making *every* starving job the head
   degenerates to first come, first served under saturation, when all bulk jobs starve at once.)
3. **Fill**: the head's items go in first, then items of the other jobs in the same order, while the
   padded cost (longest estimate x size) stays within the budget and the size cap. A fill item may be at
   most ``fill_ratio`` times as long as the head's longest item (and always up to ``short_tokens``), so a
   short request's batch is not made slow by long passages, while short requests of somewhat different
   lengths still share one forward pass (the head is the shortest job, and a cap of twice *its* length
   alone split queries into many small batches, each paying a forward pass).

Inside a job, items are scheduled in input order. The queue is not thread-safe; the engine calls it
under its lock.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable


def size_class(tokens: int) -> int:
    """The size class jobs are ordered by: work within a factor of two shares a class (powers of two).

    Exact token counts would order two 16-passage requests by a few tokens' difference, so under a
    stream of equal bulk requests the longer ones starve behind every newcomer a little shorter; in one
    class they go in arrival order, while a job half as long or less still goes first.

    Examples:
        >>> [size_class(n) for n in (1, 14, 16, 3100, 3900, 4100)]
        [1, 4, 5, 12, 12, 13]
    """
    return max(0, tokens).bit_length()


@dataclasses.dataclass(eq=False, kw_only=True)
class QueuedJob:
    """Scheduling state of one request: estimated tokens per item and how far it got."""

    est: list[int]  # estimated tokens of each item, in input order
    priority: int = 0  # lower is served first
    total: int = -1  # sum of est (computed when pushed)
    seq: int = 0  # arrival order, set by FairQueue.push
    next: int = 0  # first item not yet scheduled
    served: int = 0  # estimated tokens scheduled so far
    skipped: int = 0  # batches formed in a row without any of this job's items

    @property
    def waiting(self) -> int:
        return len(self.est) - self.next

    @property
    def work_left(self) -> int:
        """Estimated tokens not yet scheduled."""
        return self.total - self.served


class FairQueue:
    """Jobs with unscheduled items, and the batch-forming policy of the module docstring.

    Examples:
        >>> q = FairQueue()
        >>> bulk, small = QueuedJob(est=[200] * 6), QueuedJob(est=[10])
        >>> q.push(bulk)
        >>> [i for _, i in q.take(max_tokens=400, max_size=8)]  # the bulk job alone: 2 x 200 fills the budget
        [0, 1]
        >>> q.push(small)  # arrives while that batch computes
        >>> [(job is small, i) for job, i in q.take(max_tokens=400, max_size=8)]  # served next, on its own
        [(True, 0)]
        >>> [i for _, i in q.take(max_tokens=400, max_size=8)], q.queued
        ([2, 3], 2)
    """

    def __init__(self, *, starve_after: int = 4, fill_ratio: float = 2.0, short_tokens: int = 128) -> None:
        self.starve_after = starve_after
        self.fill_ratio = fill_ratio
        self.short_tokens = short_tokens
        self.jobs: list[QueuedJob] = []
        self.queued = 0  # unscheduled items over all jobs
        self.work = 0  # estimated tokens not yet scheduled over all jobs (the sum of their work_left)
        self._arrivals = itertools.count()
        self._since_rescue = 0  # batches since a starving job was last made the head

    def push(self, job: QueuedJob) -> None:
        job.seq = next(self._arrivals)
        job.total = sum(job.est)
        self.jobs.append(job)
        self.queued += job.waiting
        self.work += job.work_left

    def drop(self, gone: Callable[[QueuedJob], bool]) -> int:
        """Forget the jobs for which ``gone(job)`` is true (their caller left); returns their unscheduled items."""
        kept: list[QueuedJob] = []
        dropped = 0
        for job in self.jobs:
            if gone(job):
                dropped += job.waiting
                self.work -= job.work_left
            else:
                kept.append(job)
        self.jobs = kept
        self.queued -= dropped
        return dropped

    def clear(self) -> list[QueuedJob]:
        jobs, self.jobs, self.queued, self.work = self.jobs, [], 0, 0
        return jobs

    def order(self) -> list[QueuedJob]:
        """Jobs in the order the next batch considers them (priority, size class of the work left, arrival)."""
        return sorted(self.jobs, key=lambda j: (j.priority, size_class(j.work_left), j.seq))

    def work_ahead(self, priority: int, work: int) -> int:
        """Estimated tokens scheduled before a new job of ``priority`` and ``work`` tokens would finish
        waiting: the work left of every job that heads batches before it (a better priority, or the same
        with work left of no larger size class). Jobs of a larger class wait behind it, so they do not count.

        >>> q = FairQueue()
        >>> for est in ([100] * 10, [50] * 2, [10]):
        ...     q.push(QueuedJob(est=est))
        >>> q.work_ahead(0, 10), q.work_ahead(0, 100), q.work_ahead(0, 5000), q.work_ahead(-1, 5000)
        (10, 110, 1110, 0)
        """
        size = size_class(work)
        return sum(
            j.work_left
            for j in self.jobs
            if j.priority < priority or (j.priority == priority and size_class(j.work_left) <= size)
        )

    def head_estimate(self) -> int:
        """Estimated tokens of the next item the head job would contribute (0 when empty)."""
        order = self.order()
        return order[0].est[order[0].next] if order else 0

    def take(self, *, max_tokens: int, max_size: int) -> list[tuple[QueuedJob, int]]:
        """Pop the next batch: ``(job, item index)`` pairs, at least one when anything is queued."""
        if not self.jobs:
            return []
        order = self.order()
        starving = [j for j in order if j.skipped >= self.starve_after]
        self._since_rescue += 1
        if starving and self._since_rescue > self.starve_after:
            head = min(starving, key=lambda j: (j.priority, j.seq))
            self._since_rescue = 0
        else:
            head = order[0]
        batch: list[tuple[QueuedJob, int]] = []
        longest = 0

        def add(job: QueuedJob, cap: float | None) -> bool:
            """Add ``job``'s items while they fit; False once the batch is full."""
            nonlocal longest
            while job.next < len(job.est):
                est = job.est[job.next]
                if cap is not None and est > cap:
                    return True  # too long to ride along; the job waits for its own turn
                widest = max(longest, est)
                if batch and (widest * (len(batch) + 1) > max_tokens or len(batch) >= max_size):
                    return False
                batch.append((job, job.next))
                job.next += 1
                job.served += est
                longest = widest
            return True

        if add(head, None):
            cap = max(self.fill_ratio * longest, self.short_tokens)
            for job in order:
                if job is not head and not add(job, cap):
                    break
        taken = {id(job) for job, _ in batch}
        for job in self.jobs:
            job.skipped = 0 if id(job) in taken else job.skipped + 1
        self.jobs = [j for j in self.jobs if j.waiting]
        self.queued -= len(batch)
        self.work -= sum(job.est[i] for job, i in batch)
        return batch
