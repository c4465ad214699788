"""Coverage-guided fuzzing of every hook route (atheris). Run with `make fuzz`; not part of CI.

A finding is any answer other than 200 or 4xx with a JSON body, or an exception escaping Flask.
"""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports(include=["hooks"]):
    from hooks.app import create_app
    from hooks.settings import Settings

ROUTES = ("/status/sync", "/status/customize", "/license/sync", "/license/customize")
# KubeVirt unreadable, cached for the whole run: the fuzzer explores the hooks, not the network.
APP = create_app(
    Settings(kube_api="http://127.0.0.1:9", kube_timeout_seconds=0.05, kubevirt_cache_seconds=60)
)
APP.testing = True
CLIENT = APP.test_client()


def test_one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    route = ROUTES[provider.ConsumeIntInRange(0, len(ROUTES) - 1)]
    body = provider.ConsumeBytes(provider.remaining_bytes())
    response = CLIENT.post(route, data=body, content_type="application/json")
    if response.status_code != 200 and not 400 <= response.status_code < 500:
        raise RuntimeError(f"{route} answered {response.status_code}")
    json.loads(response.get_data())


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
