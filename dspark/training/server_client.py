"""A minimal JSON client of an OpenAI-compatible server (vLLM, `dspark serve`, llama.cpp's
server): what `dspark datagen --server` and the vLLM hidden-state source share."""

from __future__ import annotations

import json

from dspark.errors import DSparkError


class ServerClient:
    """``url`` with or without a trailing ``/v1``; errors name the URL and what came back."""

    def __init__(self, url: str, *, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.timeout = timeout

    def post(self, path: str, body: dict | None = None) -> dict:
        """POST ``body`` as JSON (GET without one); the decoded JSON answer."""
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise DSparkError(f"{self.url}{path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
            raise DSparkError(f"{self.url}{path}: no usable answer ({exc})") from None

    def served_model(self, hint: str = "") -> str:
        """The first model id the server lists."""
        models = self.post("/v1/models").get("data") or []
        if not models:
            raise DSparkError(f"{self.url}/v1/models lists no model{hint}")
        return str(models[0]["id"])
