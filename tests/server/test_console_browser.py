"""The web console in a real headless Chromium (Debian's, driven by Selenium through its
chromedriver) against a gateway on real runc: sign in, the list following REST, a
terminal, files up and down, kill, tenancy, logout. Screenshots of each page go to
$ABX_TEST_ARTIFACTS/console (default: the temp dir's abx-artifacts/console)."""

from __future__ import annotations

import base64
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from _gw import Gateway

pytestmark = pytest.mark.integration

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup.sh test installs "
                "them)", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the test extra)")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

SHOTS = Path(os.environ.get("ABX_TEST_ARTIFACTS")
             or Path(tempfile.gettempdir()) / "abx-artifacts") / "console"
WAIT = 30.0


class Browser:
    def __init__(self, url: str, downloads: Path) -> None:
        self.url, self.downloads = url, downloads
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                    "--disable-gpu", "--window-size=1280,900", "--no-first-run"):
            options.add_argument(arg)
        options.add_experimental_option("prefs", {
            "download.default_directory": str(downloads), "download.prompt_for_download": False})
        os.environ.setdefault("SE_OFFLINE", "true")  # no Selenium Manager downloads
        self.driver = webdriver.Chrome(service=Service(DRIVER), options=options)

    def open(self, hash_: str) -> None:
        self.driver.get(f"{self.url}/ui/{hash_}")

    def until(self, check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                found = check()
            except (StaleElementReferenceException, WebDriverException, IndexError):
                found = None
            if found:
                return found
            if time.monotonic() > deadline:
                self.shot("timeout")
                raise AssertionError(f"the page did not show {what} within {timeout:g}s")
            time.sleep(0.1)

    def css(self, selector: str) -> list[Any]:
        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def text(self) -> str:
        return self.driver.find_element(By.TAG_NAME, "main").text

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.driver.save_screenshot(str(SHOTS / f"{name}.png"))

    def accept(self) -> None:
        def alert() -> Any:
            try:
                return self.driver.switch_to.alert
            except NoAlertPresentException:
                return None
        self.until(alert, "a confirmation").accept()

    def sign_in(self, token: str) -> None:
        self.open("#/login")
        key = self.until(lambda: self.css("#key"), "the sign-in form")[0]
        key.send_keys(token)
        self.css("form.login button[type=submit]")[0].click()
        self.until(lambda: self.css("#sandboxes table"), "the sandbox list")

    def sign_out(self) -> None:
        self.driver.find_element(By.ID, "logout").click()
        self.until(lambda: self.css("#key"), "the sign-in form")


@pytest.fixture(scope="module")
def browser(gw: Gateway) -> Iterator[Browser]:
    downloads = Path(tempfile.mkdtemp(prefix="abx-console-dl-"))
    b = Browser(gw.url, downloads)
    try:
        yield b
    finally:
        b.driver.quit()
        shutil.rmtree(downloads, ignore_errors=True)


@pytest.fixture(scope="module")
def sandboxes(gw: Gateway) -> Iterator[dict[str, str]]:
    """A's sandbox (made over REST while the page shows the list) and B's (never shown)."""
    made: dict[str, str] = {"b": gw.provider("b").create().sandbox_id}
    yield made
    for who, sid in made.items():
        try:
            gw.provider(who.rstrip("0123456789")).kill(sid, delete_volume=True)
        except Exception:  # noqa: BLE001 - killed by the test
            pass


def test_sign_in_and_the_list_updates_when_rest_creates(browser: Browser, gw: Gateway,
                                                         sandboxes: dict[str, str]) -> None:
    browser.open("#/")
    browser.until(lambda: browser.css("#key"), "the sign-in form")
    browser.shot("01-sign-in")
    browser.sign_in(gw.tokens["a"])
    sandboxes["a"] = gw.provider("a").create().sandbox_id
    browser.until(lambda: sandboxes["a"] in browser.text(), "A's new sandbox")
    assert sandboxes["b"] not in browser.text()  # another tenant's sandbox never appears

    def cpu_shown() -> bool:  # the row's CPU from the sandbox's metrics (its cgroup)
        rows = browser.driver.find_elements("xpath", f"//tr[contains(., '{sandboxes['a']}')]")
        return any("%" in row.text for row in rows)

    browser.until(cpu_shown, "A's sandbox's CPU use in its row")
    browser.shot("02-sandboxes")
    assert "abx_" not in browser.driver.execute_script(
        "return JSON.stringify(localStorage) + JSON.stringify(sessionStorage) + "
        "document.cookie + location.href")


def test_terminal_runs_echo_hi(browser: Browser, sandboxes: dict[str, str]) -> None:
    browser.open(f"#/sandbox/{sandboxes['a']}/terminal")
    browser.until(lambda: "terminal pid" in browser.css("#terminal-status")[0].text,
                  "an open terminal")
    browser.css("#terminal .xterm-helper-textarea")[0].send_keys("echo hi\n")

    def rows() -> list[str]:
        return [r.text.strip() for r in browser.css("#terminal .xterm-rows > div")]
    browser.until(lambda: "hi" in rows(), "the line 'hi' in the terminal")
    browser.shot("03-terminal")


def press(browser: Browser, rows: str, name: str, action: str) -> None:
    """Click the button of the row showing ``name`` (again if a redraw made it stale)."""
    def click() -> bool:
        row = [r for r in browser.css(rows) if name in r.text][0]
        row.find_element(By.CSS_SELECTOR, f"[data-action='{action}']").click()
        return True
    browser.until(click, f"the {action} button of {name}")


def test_upload_preview_download_and_delete_a_file(browser: Browser, gw: Gateway,
                                                   sandboxes: dict[str, str]) -> None:
    sid = sandboxes["a"]
    browser.open(f"#/sandbox/{sid}/files")
    browser.until(lambda: browser.css("#files table"), "the file list")
    local = browser.downloads.parent / f"abx-console-up-{os.getpid()}.txt"
    local.write_text("hello from the browser\n")
    try:
        browser.css("#upload")[0].send_keys(str(local))
        name = local.name
        browser.until(lambda: name in browser.css("#files")[0].text, "the uploaded file")
        got = b"".join(gw.provider("a").read_file(sid, f"/workspace/{name}"))
        assert got == b"hello from the browser\n"
        gw.provider("a").write_file(sid, "/workspace/shown.txt", "<b>not markup</b>")
        browser.css("#path")[0].submit()
        link = browser.until(lambda: [b for b in browser.css("#files button.link")
                                      if b.text == "shown.txt"], "shown.txt")[0]
        link.click()
        browser.until(lambda: browser.css("#preview-text")
                      and browser.css("#preview-text")[0].text == "<b>not markup</b>",
                      "the preview as text")
        # An image is shown as a data: URL (a blob: URL would be this origin's page).
        png = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"
                               "z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==")
        gw.provider("a").write_file(sid, "/workspace/dot.png", png)
        browser.css("#path")[0].submit()
        browser.until(lambda: [b for b in browser.css("#files button.link")
                               if b.text == "dot.png"], "dot.png")[0].click()
        image = browser.until(lambda: browser.css("#preview-image"), "the image preview")[0]
        assert image.get_attribute("src").startswith("data:image/png;base64,")
        browser.until(lambda: browser.driver.execute_script(
            "return document.getElementById('preview-image').naturalWidth") == 1,
            "the image decoded")
        browser.shot("04-files")
        press(browser, "#files tr", name, "download")
        saved = browser.downloads / name
        browser.until(lambda: saved.exists() and saved.read_bytes()
                      == b"hello from the browser\n", "the downloaded file")
        press(browser, "#files tr", name, "delete")
        browser.accept()
        browser.until(lambda: name not in browser.css("#files")[0].text, "the file gone")
        assert not gw.provider("a").exists(sid, f"/workspace/{name}")
    finally:
        local.unlink(missing_ok=True)


def test_every_page_renders(browser: Browser, gw: Gateway, sandboxes: dict[str, str]) -> None:
    """Screenshots of the remaining pages (a tenant's, then an admin's), dark and at phone
    width too."""
    sid = sandboxes["a"]
    pid = gw.provider("a").start(sid, "echo from-a-process; sleep 60")
    browser.open(f"#/sandbox/{sid}/processes")
    browser.until(lambda: browser.css(f"[data-pid='{pid}']"), "the process")[0].click()
    browser.until(lambda: "from-a-process" in browser.css("#process-output")[0].text,
                  "the process's output")
    for n, (page, ready) in enumerate([
            (f"#/sandbox/{sid}/processes", "Output"), (f"#/sandbox/{sid}/ports", "reach port"),
            (f"#/sandbox/{sid}/audit", "GET"), ("#/templates", "base"),
            ("#/volumes", "Volume")], start=5):
        browser.open(page)
        browser.until(lambda ready=ready: ready in browser.text(), f"{page}")
        browser.shot(f"{n:02d}-{page.rsplit('/', 1)[-1]}")
    browser.open("#/keys")
    browser.until(lambda: browser.css("#admin-only"), "the keys page refused")
    assert not browser.css("#new-token")  # a tenant has no keys page
    browser.sign_out()
    browser.sign_in(gw.tokens["admin"])
    assert sandboxes["b"] in browser.text()  # an admin sees every tenant's
    browser.open("#/keys")
    browser.until(lambda: browser.css("#name"), "the keys page")
    browser.shot("10-keys")
    browser.open("#/health")
    browser.until(lambda: browser.css("#health"), "the health page")
    browser.shot("11-health")
    browser.driver.find_element(By.ID, "theme").click()
    browser.open("#/")
    browser.until(lambda: browser.css("#sandboxes table"), "the sandbox list")
    browser.shot("12-sandboxes-theme-toggled")
    browser.driver.set_window_size(390, 844)
    browser.shot("13-sandboxes-phone")
    browser.driver.set_window_size(1280, 900)
    browser.sign_out()


def test_kill_from_the_list(browser: Browser, gw: Gateway, sandboxes: dict[str, str]) -> None:
    browser.sign_in(gw.tokens["a"])
    sid = sandboxes["a"]
    browser.until(lambda: sid in browser.text(), "A's sandbox")

    def press_(action: str) -> None:  # the list redraws every 2 s
        press(browser, "#sandboxes tr", sid, action)

    def state() -> str:
        return gw.provider("a").info(sid).state
    press_("pause")
    browser.until(lambda: state() == "paused" and browser.css(
        "#sandboxes [data-action=resume]"), "the sandbox paused")
    press_("resume")
    browser.until(lambda: state() == "running" and browser.css(
        "#sandboxes [data-action=pause]"), "the sandbox running again")
    press_("reset")
    browser.accept()
    browser.until(lambda: f"reset: {sid}" in browser.text(), "the system layer reset")
    press_("kill + volume")
    browser.accept()
    browser.until(lambda: sid not in browser.css("#sandboxes")[0].text, "the sandbox gone")
    assert sid not in {s.sandbox_id for s in gw.provider("a").list()}


def test_a_stolen_cookie_is_useless_after_logout(browser: Browser, gw: Gateway) -> None:
    cookie = browser.driver.get_cookie("abx_console")
    assert cookie and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    with httpx.Client(base_url=gw.url, cookies={"abx_console": cookie["value"]}) as thief:
        assert thief.get("/v1/sandboxes").status_code == 200
        browser.sign_out()
        browser.shot("14-signed-out")
        assert thief.get("/v1/sandboxes").status_code == 401


def test_a_share_link_from_another_site_runs_confined_for_a_signed_in_user(
        browser: Browser, gw: Gateway, sandboxes: dict[str, str]) -> None:
    """A tenant's share link, clicked on another site by someone signed in here: the
    first request carries no console cookie (SameSite=Strict), so it is answered by a
    bounce from this origin, and the page then runs as an opaque origin, unable to use
    the console's session."""
    provider = gw.provider("a")
    sid = provider.create().sandbox_id
    sandboxes["a2"] = sid
    provider.run(sid, "mkdir -p /tmp/site && echo hello > /tmp/site/index.html")
    provider.start(sid, "python3 -m http.server 8000 --directory /tmp/site")
    link = provider.share_port(sid, 8000).url
    browser.open("#/")
    browser.until(lambda: browser.css("#key"), "the sign-in form")
    browser.sign_in(gw.tokens["b"])  # another tenant, signed in: the cookie is in the browser
    browser.driver.get("data:text/html,<a id=go href='" + link + "'>open</a>")
    browser.driver.find_element(By.ID, "go").click()
    browser.until(lambda: "hello" in browser.driver.page_source, "the shared page")
    assert browser.driver.execute_script("return window.origin") == "null"  # confined
