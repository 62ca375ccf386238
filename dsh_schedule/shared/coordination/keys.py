"""Every Redis key this project writes, built in one place under one prefix
(docs/architecture.md#layout)."""

from __future__ import annotations

from typing import Final

STREAM_GROUP: Final = "host"


class Keys:
    """Key names for one prefix. rq's own keys are separated by the queue name."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def lock(self, agent: str) -> str:
        return f"{self.prefix}lock:{agent}"

    def phase(self, agent: str) -> str:
        return f"{self.prefix}phase:{agent}"

    def idle_waiter(self, agent: str) -> str:
        return f"{self.prefix}waiter:{agent}"

    def hosts(self) -> str:
        """ZSET host -> the expiry of its lease (epoch ms): an agent is live while the
        host serving it holds a valid lease (docs/architecture.md#leases)."""
        return f"{self.prefix}hosts"

    def served(self, host: str) -> str:
        """SET of the agents ``host`` serves; ``served("")`` is the prefix of them all."""
        return f"{self.prefix}served:{host}"

    def agent_host(self) -> str:
        """HASH agent -> the host serving it (written at install, never at a renewal)."""
        return f"{self.prefix}agent-host"

    def lease_queue(self) -> str:
        """HASH agent -> the rq queue beside the agent's session store."""
        return f"{self.prefix}lease-queue"

    def host_digest(self) -> str:
        """HASH host -> the sum (modulo 2^48) of a hash of every agent whose ``agent-host``
        entry names it, kept by the scripts that write those entries
        (docs/architecture.md#leases)."""
        return f"{self.prefix}host-digest"

    def generation(self) -> str:
        """STRING: a token written once; a Redis without it has lost data
        (docs/architecture.md#the-generation-marker)."""
        return f"{self.prefix}generation"

    def followups(self, agent: str) -> str:
        return f"{self.prefix}followups:{agent}"

    def followup_counts(self) -> str:
        """HASH agent -> the entries its followup stream held when a followup script last
        wrote it (no field: none): the counter's part per agent, so a script that writes
        a stream puts right what that stream counts, whatever was lost before."""
        return f"{self.prefix}followup-counts"

    def followup_total(self) -> str:
        """STRING: the sum of ``followup_counts``, what ``status`` and the pending-followups
        gauge read in one command."""
        return f"{self.prefix}followup-total"

    def ready(self, queue: str) -> str:
        """STREAM of agent ids whose followup stream gained an entry, one per host queue
        (the queue a lease names): what a host serving that queue blocks on."""
        return f"{self.prefix}ready:{queue}"

    def current_wake(self, agent: str) -> str:
        return f"{self.prefix}wake:{agent}"

    def wake_counter(self, agent: str) -> str:
        return f"{self.prefix}wake-seq:{agent}"

    def scheduled_jobs(self) -> str:
        return f"{self.prefix}rq-scheduler:scheduled_jobs"

    def mover_nudge(self) -> str:
        """LIST of at most one element: pushed whenever a wake is armed, so a scheduler
        blocked until its next known due time runs a pass at once."""
        return f"{self.prefix}mover-nudge"

    def scheduler_lock(self) -> str:
        return f"{self.prefix}rq-scheduler:lock"

    def scheduler_instances(self) -> str:
        return f"{self.prefix}rq-scheduler:instance:"

    def scheduler(self) -> str:
        return f"{self.prefix}rq-scheduler"

    def scheduler_heartbeat(self) -> str:
        """STRING with a TTL: the last scheduler pass (JSON: when, by which host and
        process, how often passes come); refreshed by every scheduler loop, at most about
        once a second. Its age is the TTL it was written with minus the PTTL left, so
        reading it needs no clock but Redis's (docs/architecture.md#operations)."""
        return f"{self.prefix}scheduler:heartbeat"

    def workers(self) -> str:
        """ZSET rq worker name -> the epoch ms (Redis's clock) by which it beats again; a
        score in the past is a worker that died, or one a scheduler is recovering
        (docs/architecture.md#a-dead-workers-wakes)."""
        return f"{self.prefix}workers"

    def worker_beats(self) -> str:
        """ZSET rq worker name -> the epoch ms (Redis's clock) by which it beats again, as
        ``workers`` but written only by the worker itself (a scheduler recovering a dead
        worker moves the score in ``workers``, never here): what ``health`` reads. A
        worker leaving cleanly removes its entry; an entry a day stale is pruned by any
        worker's beat."""
        return f"{self.prefix}worker-beats"

    def worker_holds(self) -> str:
        """HASH rq worker name -> the wake job it is executing and that job's agents
        (JSON), written in rq's own start and end of the job."""
        return f"{self.prefix}worker-holds"

    def worker_probe(self) -> str:
        """STRING with a 1 s TTL: the write a worker waiting out an outage tries, since
        a Redis refusing writes still answers PING."""
        return f"{self.prefix}worker-probe"

    def scheduler_reconcile(self) -> str:
        """STRING with a TTL: a summary of the last rebuild or reconcile pass (JSON)."""
        return f"{self.prefix}scheduler:last-reconcile"

    def clock_skew(self) -> str:
        """HASH process name -> its last clock-skew report, while its wall clock is off
        Redis's by more than the bound (``coordination.clock``)."""
        return f"{self.prefix}clock-skew"

    # -- timers of sessions no host has loaded (docs/architecture.md#unloaded-sessions) --

    def unloaded(self, queue: str) -> str:
        """ZSET session -> the epoch ms its timer falls due, for the sessions of one host
        group (a queue) that no host serves: what the scheduler's pass reads."""
        return f"{self.prefix}unloaded:{queue}"

    def unloaded_queues(self) -> str:
        """SET of the queues whose ``unloaded`` ZSET may hold a timer."""
        return f"{self.prefix}unloaded-queues"

    def load_attempts(self, queue: str) -> str:
        """HASH session -> how many load requests were announced since its timer was
        written: a field is a request outstanding."""
        return f"{self.prefix}load-attempts:{queue}"

    def load_requests(self, queue: str) -> str:
        """STREAM of load requests (field ``session``, ``attempt``) to one host group."""
        return f"{self.prefix}load-requests:{queue}"

    def loading(self, session: str) -> str:
        """STRING with a TTL: the host that claimed the load of ``session``."""
        return f"{self.prefix}loading:{session}"
