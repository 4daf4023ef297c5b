"""python manage.py runagents [--concurrency N]: the worker process."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from runs import heap
from runs.engine.worker import Worker


class Command(BaseCommand):
    help = "Run agent runs from the queue (claims, heartbeats, reaps; SIGTERM stops gracefully)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=settings.RUNS_WORKER_CONCURRENCY,
            help="runs executed at once by this process",
        )
        parser.add_argument(
            "--owner", default=None, help="lease owner id (default host:pid:random)"
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="serve this worker's Prometheus metrics on this port",
        )

    def handle(
        self,
        *args: Any,
        concurrency: int,
        owner: str | None,
        metrics_port: int | None,
        **options: Any,
    ) -> None:
        if concurrency < 1:
            self.stderr.write("--concurrency must be at least 1")
            raise SystemExit(2)
        worker = Worker(concurrency=concurrency, owner=owner)
        if metrics_port is not None:
            from prometheus_client import start_http_server

            start_http_server(metrics_port)
            self.stdout.write(f"metrics on :{metrics_port}/metrics")

        def stop(signum: int, frame: Any) -> None:
            self.stdout.write(f"signal {signum}: stopping (finishing steps, releasing leases)")
            worker.stop()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, stop)
            signal.signal(signal.SIGINT, stop)
        # The agents, the engine and Django are loaded: their objects out of the collector's
        # way for the life of the process (runs/heap.py).
        heap.freeze_heap()
        self.stdout.write(f"worker {worker.owner} running with concurrency {concurrency}")
        self.stdout.flush()
        worker.run_forever()
