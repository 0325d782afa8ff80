"""A console visitor over plain HTTP: GET and form POST with a cookie jar, no redirects
followed, so a test sees each answer (303, Set-Cookie) as the browser would receive it."""

from __future__ import annotations

import http.client
import re
import urllib.parse
from dataclasses import dataclass, field


@dataclass
class Page:
    status: int
    headers: dict[str, str]
    cookies: list[str]
    text: str

    def csrf(self) -> str:
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', self.text)
        assert found is not None, self.text[:500]
        return found.group(1)

    def by_id(self, element_id: str) -> str | None:
        """The text inside the first element with this id (no nested tags of its kind)."""
        found = re.search(rf'id="{re.escape(element_id)}"[^>]*>(.*?)</', self.text, re.S)
        return None if found is None else found.group(1).strip()


@dataclass
class Visitor:
    port: int
    jar: dict[str, str] = field(default_factory=dict)
    bearer: str | None = None

    def get(self, path: str) -> Page:
        return self.request("GET", path)

    def post(self, path: str, form: dict[str, str]) -> Page:
        return self.request("POST", path, urllib.parse.urlencode(form).encode())

    def request(self, method: str, path: str, body: bytes | None = None) -> Page:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Host": f"127.0.0.1:{self.port}"}
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if self.jar:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.jar.items())
        if self.bearer is not None:
            headers["Authorization"] = f"Bearer {self.bearer}"
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8")
            cookies = resp.headers.get_all("Set-Cookie") or []
            for c in cookies:
                name, _, rest = c.partition("=")
                value = rest.split(";", 1)[0]
                if "Max-Age=0" in c:
                    self.jar.pop(name, None)
                else:
                    self.jar[name] = value
            return Page(resp.status, {k.lower(): v for k, v in resp.getheaders()}, cookies, text)
        finally:
            conn.close()

    def login(self, token: str) -> Page:
        return self.post("/console/login", {"token": token})
