"""The proxy's live page (``GET /agentcache/``): the same tenant rules as the JSON report, the page's content
for a conversation with a subagent and a break, and a real headless Chromium (Selenium, Debian's chromedriver)
watching the session tree, the timelines and the break's cause appear while traffic flows, without reloading,
never showing another tenant's sessions.

``AGENTCACHE_DOCS_SCREENSHOT=1`` also saves the browser's view as ``docs/img/live.png`` (the image README and
docs/proxy.md show)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcache._config import Settings
from agentcache.analysis._report_logs import FIXES
from agentcache.proxy import ProxyConfig, create_app
from tests import needs
from tests.test_proxy_support import (
    ANTHROPIC_KEY,
    OTHER_KEY,
    FakeUpstream,
    ServerThread,
    anthropic_body,
    conversation,
    proxy,
    settings,
)

ADMIN = "admin-token-for-the-live-page"
DOCS_IMAGE = Path(__file__).resolve().parent.parent / "docs" / "img" / "live.png"


def _traffic(post: Any, key: str = ANTHROPIC_KEY) -> None:
    """A main session (3 turns), its subagent (2 turns), then the main session with a changed system prompt."""
    msgs = conversation(8)
    main = {"x-api-key": key, "x-agentcache-session": "main"}
    sub = {"x-api-key": key, "x-agentcache-session": "helper", "x-agentcache-parent": "main"}
    for n in (1, 3, 5):
        post(anthropic_body(msgs[:n]), main)
    for n in (1, 3):
        post(anthropic_body(msgs[:n]), sub)
    changed = anthropic_body(msgs[:7])
    changed["system"] = "Today is a new day. " + str(changed["system"])
    post(changed, main)


def test_live_page_shows_the_callers_tenant_only() -> None:
    asyncio.run(_tenant_only())


async def _tenant_only() -> None:
    async with proxy(admin_token=ADMIN) as (client, state, _fake):
        sent: list[tuple[dict[str, Any], dict[str, str]]] = []
        _traffic(lambda body, headers: sent.append((body, headers)))
        for body, headers in sent:
            assert (await client.post("/v1/messages", json=body, headers=headers)).status_code == 200
        other = {"x-api-key": OTHER_KEY, "x-agentcache-session": "other-secret"}
        assert (await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=other)).status_code
        assert sum(s.requests for s in state.report.report().sessions) == 7  # recorded before the answer ended

        page = await client.get("/agentcache/", headers={"x-api-key": ANTHROPIC_KEY})
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert "x-agentcache-worker" not in page.headers and 'id="worker"' not in page.text  # one worker: one view
        html = page.text
        assert "other-secret" not in html and "http://" not in html.replace("http://www.w3.org", "")
        rows = re.findall(r'<tr class="(root|sub)" data-session="[^"]*/(\w+)"', html)
        assert rows == [("root", "main"), ("sub", "helper")]
        assert re.search(r'<td class="cause"><code>system\.changed</code>', html)
        assert html.count("<td>python-httpx</td><td>claude-opus-4-8</td>") == 2  # client (its user agent), model
        assert html.count('class="panel timeline"') == 2 and 'class="miss"' in html
        causes = re.search(r'<table id="causes">.*?</table>', html, re.S)
        assert causes is not None and "system.changed" in causes.group(0)
        (row,) = [r for r in _table(html, "causes") if r[1] == "system.changed"]
        assert row[-1] == FIXES["system.changed"]  # what to do: the audits' one table of fixes

        fragment = await client.get("/agentcache/?fragment=1", headers={"x-api-key": ANTHROPIC_KEY})
        assert fragment.status_code == 200 and "<html" not in fragment.text and "helper" in fragment.text
        theirs = await client.get("/agentcache/?fragment=1", headers={"x-api-key": OTHER_KEY})
        assert "other-secret" in theirs.text and "helper" not in theirs.text
        denied = await client.get(f"/agentcache/?tenant={page.headers['x-agentcache-tenant']}")
        assert denied.status_code == 403
        typed = await client.get("/agentcache", headers={"x-api-key": ANTHROPIC_KEY})  # as people type it
        assert (typed.status_code, typed.headers["location"]) == (308, "/agentcache/")
        every = await client.get("/agentcache/", headers={"x-agentcache-admin-token": ADMIN})
        assert every.headers["x-agentcache-tenant"] == "*" and "other-secret" in every.text and "helper" in every.text
        assert (await client.get("/agentcache/", headers={"x-agentcache-admin-token": "wrong"})).status_code == 401


def _driver() -> Any:
    webdriver = pytest.importorskip("selenium.webdriver", reason=needs.extra("dev"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip(needs.CHROMIUM)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100", "--hide-scrollbars"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))


def test_live_page_updates_in_headless_chromium() -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    fake = FakeUpstream()
    config = ProxyConfig()
    app = create_app(config, settings=settings(), transport=fake.transport())
    driver = _driver()
    try:
        with ServerThread(app, proxy=config) as server, httpx.Client(base_url=server.url) as http:
            # The browser is the tenant of ANTHROPIC_KEY: it sends that key with every request, as a client would.
            driver.execute_cdp_cmd("Network.enable", {})
            driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"x-api-key": ANTHROPIC_KEY}})
            driver.get(server.url + "/agentcache/")
            assert "No traffic yet" in driver.find_element(By.ID, "live").text
            driver.execute_script("window.notReloaded = true")

            def post(body: dict[str, Any], headers: dict[str, str]) -> None:
                assert http.post("/v1/messages", json=body, headers=headers).status_code == 200

            _traffic(post)
            other = {"x-api-key": OTHER_KEY, "x-agentcache-session": "other-secret"}
            post(anthropic_body(conversation(3)), other)

            def shown(d: Any) -> bool:
                rows = d.find_elements(By.CSS_SELECTOR, "#session-tree tr[data-session]")
                causes = d.find_elements(By.CSS_SELECTOR, "#session-tree td.cause code")
                return len(rows) == 2 and any(c.text == "system.changed" for c in causes)

            WebDriverWait(driver, 30, poll_frequency=0.2).until(shown)
            assert driver.execute_script("return window.notReloaded") is True  # updated in place
            rows = driver.find_elements(By.CSS_SELECTOR, "#session-tree tr[data-session]")
            assert [r.get_attribute("class") for r in rows] == ["root", "sub"]
            assert "helper" in rows[1].text and "subagent" in rows[1].text
            panels = driver.find_elements(By.CSS_SELECTOR, "#timelines .timeline")
            assert len(panels) == 2
            assert panels[0].find_elements(By.CSS_SELECTOR, "svg rect.read")  # later turns read the cache
            assert panels[0].find_elements(By.CSS_SELECTOR, "svg rect.miss")  # the break, marked above its turn
            assert "system.changed" in driver.find_element(By.ID, "causes").text
            assert "other-secret" not in driver.page_source
            assert driver.find_element(By.ID, "status").text == "live"
            # Readable on a laptop screen: nothing wider than a 1280-pixel window.
            driver.set_window_size(1280, 800)
            assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
            driver.set_window_size(1400, 1100)
            if os.environ.get("AGENTCACHE_DOCS_SCREENSHOT") == "1":
                DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(DOCS_IMAGE))
            # The system's dark mode: a dark background, light text.
            driver.execute_cdp_cmd(
                "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
            )
            background = driver.execute_script("return getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(18, 23, 28)"
    finally:
        driver.quit()


def _table(html: str, table_id: str) -> list[list[str]]:
    """The body rows of the table ``table_id`` as cell texts (tags dropped)."""
    found = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', html, re.S)
    assert found is not None, f"no table {table_id}"
    rows = re.findall(r"<tr>(.*?)</tr>", found.group(1), re.S)
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)] for r in rows]


def test_live_page_shows_keep_warm_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_proxy_keepwarm import HEADERS, Clock, paused_turns, served

    clock = Clock()
    clock.install(monkeypatch)

    async def no_wait(seconds: float) -> None:
        pass

    async def scenario() -> str:
        fake = FakeUpstream()
        async with served(Settings(keep_warm=True, ttl_policy="5m"), fake, no_wait) as (client, _):
            await paused_turns(client, clock)
            return (await client.get("/agentcache/?fragment=1", headers=HEADERS)).text

    rows = _table(asyncio.run(scenario()), "keep-warm")
    send = next(r for r in rows if r[0] == "send")
    assert send[1:4] == ["2", "1", "4"]  # turns 2 and 3 each planned 2 refreshes (tests/test_proxy_keepwarm.py)


def test_live_page_shows_coalesced_siblings() -> None:
    from tests.test_coalesce import Arrivals, _proxy, _send_siblings, sibling
    from tests.test_wrap_upstream import FakeUpstream as ThreadedUpstream

    up = ThreadedUpstream()
    try:
        Arrivals(up)
        app, _ = _proxy(up)
        with ServerThread(app) as server:
            _, responses = asyncio.run(_send_siblings(server.url, [sibling(i) for i in range(4)]))
            assert [r.status_code for r in responses] == [200] * 4
            html = httpx.get(server.url + "/agentcache/?fragment=1").text
    finally:
        up.close()
    (released,) = [r for r in _table(html, "coalescing") if r[0] == "released"]
    assert released[1:3] == ["3", "3"] and float(released[3]) > 1.0
    assert 3 * 3000 <= int(released[4].replace(",", "")) <= 3 * 3300  # as test_coalesce.py measures it


def test_live_page_names_title_calls_and_every_model_of_a_session() -> None:
    """Claude Code's lineage: a title call (no tools) is a side call, not a subagent; a session that switched
    models shows both, in order of first use."""
    asyncio.run(_title_and_models())


async def _title_and_models() -> None:
    async with proxy() as (client, _state, _fake):
        msgs = conversation(6)
        lineage = {"x-api-key": ANTHROPIC_KEY, "x-claude-code-session-id": "cc-lineage"}
        for body in (
            anthropic_body(msgs[:1]),
            {"model": "claude-haiku-4-5", "max_tokens": 32, "system": "Write a title.", "messages": msgs[:1]},
            anthropic_body(msgs[:3]),
            anthropic_body(msgs[:5], model="claude-sonnet-4-6"),
        ):
            assert (await client.post("/v1/messages", json=body, headers=lineage)).status_code == 200
        html = (await client.get("/agentcache/?fragment=1", headers={"x-api-key": ANTHROPIC_KEY})).text
    rows = re.findall(r'<tr class="(root|sub)" data-session="[^"]*".*?</tr>', html, re.S)
    assert rows == ["root", "sub"]
    tree = re.search(r'<table class="tree" id="session-tree">.*?</table>', html, re.S)
    assert tree is not None
    cells = [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
             for r in re.findall(r"<tr class=\"(?:root|sub)\"[^>]*>(.*?)</tr>", tree.group(0), re.S)]  # fmt: skip
    (main, title) = cells
    assert main[2] == "claude-opus-4-8, claude-sonnet-4-6"  # the switch shows both models
    assert title[0].endswith("side call") and "subagent" not in title[0]
    assert title[2] == "claude-haiku-4-5"


def test_live_page_says_a_model_is_not_in_the_price_table() -> None:
    async def scenario() -> str:
        async with proxy() as (client, _state, _fake):
            headers = {"x-api-key": ANTHROPIC_KEY, "x-agentcache-session": "new-model"}
            body = anthropic_body(conversation(1), model="claude-nova-9")
            assert (await client.post("/v1/messages", json=body, headers=headers)).status_code == 200
            return (await client.get("/agentcache/?fragment=1", headers={"x-api-key": ANTHROPIC_KEY})).text

    html = asyncio.run(scenario())
    warning = re.search(r'<p class="warn">(.*?)</p>', html, re.S)
    assert warning is not None
    text = re.sub(r"<[^>]+>", "", warning.group(1))
    assert "claude-nova-9 (1 requests) is not in the anthropic price table" in text
    assert "priced as claude-opus-4-8, an estimate" in text
