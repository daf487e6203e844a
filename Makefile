.PHONY: demo test test-fast stress soak setup services lint sizes bench

demo:          ## run the demo on the embedded local scheduler, Airflow's SQLite and Prefect's temporary server
	bash scripts/demo.sh

test:          ## set everything up (venv, Docker, Slurm) and run lint, types and the whole test suite
	bash scripts/test.sh

test-fast:     ## no services: lint, types and the unit tier (tests/unit: pure modules, the watch on an in-memory scheduler)
	bash scripts/setup.sh
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy core airflow_provider prefect_tasks
	.venv/bin/pytest tests/unit

stress:        ## the stress tier alone, scaled up (SHIPYARD_STRESS_SCALE, default here 5); make test runs it at scale 1
	SHIPYARD_STRESS_SCALE=$${SHIPYARD_STRESS_SCALE:-5} .venv/bin/pytest tests/stress -s

soak:          ## the soak of issue 30 (needs the services; not in make test): 10 min of Airflow, Prefect and CLI load, a service restarted every 2 min, every job checked (figures: docs/reliability.md)
	.venv/bin/python -m tests.soak.soak --minutes 10

setup:
	bash scripts/setup.sh

services:
	bash scripts/start_services.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy core airflow_provider prefect_tasks
	.venv/bin/python scripts/check_sizes.py core airflow_provider prefect_tasks

sizes:         ## no function over 80 lines, no module over 800, unless a `# size: reason` says why
	.venv/bin/python scripts/check_sizes.py core airflow_provider prefect_tasks

bench:         ## benchmarks beside their physical limits (needs the services)
	.venv/bin/python -m bench
