.PHONY: demo test setup services lint sizes bench

demo:          ## run the demo on the embedded local scheduler, Airflow's SQLite and Prefect's temporary server
	bash scripts/demo.sh

test:          ## set everything up (venv, Docker, Slurm) and run lint, types and the whole test suite
	bash scripts/test.sh

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
