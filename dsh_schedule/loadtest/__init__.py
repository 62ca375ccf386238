"""The load test and benchmark: ``dsh-schedule loadtest`` (see docs/benchmarks.md)."""
