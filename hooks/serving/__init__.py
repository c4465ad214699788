"""The serving machinery: gunicorn's arbiter and worker, the edge in front of its threads, the
Flask app that serves the route table, bodies and the memory budget, large calls computed apart,
the probe and metrics listeners, the metrics and the logs. No domain module imports it
(import-linter holds that): the hooks would compute the same answers under another server."""
