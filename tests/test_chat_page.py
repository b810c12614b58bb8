"""The chat page of `gemma-cy serve` (docs/server.md) in a real headless
browser: Debian's chromium driven by selenium. A typed message gets a reply
streamed into the page (the reply's element changes token by token), and
the reply is the one ``Model.chat_complete`` gives the same turn; the page
shows its tok/s; a second turn carries the first."""
from __future__ import annotations

import os
import shutil

import pytest

webdriver = pytest.importorskip("selenium.webdriver", reason="the chat page test needs selenium (make test "
                                                             "installs it)")
pytest.importorskip("fastapi", reason="gemma-cy serve needs its extra: pip install 'gemma-cy[server]'")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if CHROMIUM is None or DRIVER is None:
    pytest.skip("the chat page test needs chromium and its driver: apt-get install chromium chromium-driver "
                "(.ci/run installs them)", allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

import gemma_cy  # noqa: E402
from server_helpers import ServerProcess  # noqa: E402

pytestmark = pytest.mark.browser

SCREENSHOT = os.environ.get("GEMMA_CY_SCREENSHOT")  # where to save the page (docs/chat_page.png is one)


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


def reply_of(browser, element) -> str:
    return browser.execute_script("return arguments[0].firstChild ? arguments[0].firstChild.textContent : ''",
                                  element)


def send(browser, text: str, turn: int):
    box = browser.find_element(By.ID, "input")
    box.send_keys(text)
    browser.execute_script("""
        window.changes = 0;
        new MutationObserver((records) => {
            for (const r of records) for (const n of r.addedNodes)
                if (n.classList && n.classList.contains('assistant'))
                    new MutationObserver(() => { window.changes += 1; }).observe(n, {childList: true});
        }).observe(document.getElementById('log'), {childList: true});""")
    box.send_keys("\n")
    WebDriverWait(browser, 120).until(
        lambda b: len(b.find_elements(By.CSS_SELECTOR, ".assistant[data-state=done]")) == turn)
    return browser.find_elements(By.CSS_SELECTOR, ".assistant")[-1]


def test_a_typed_message_gets_a_streamed_reply(browser, default_model):
    server = ServerProcess("-m", default_model, "--ctx", "512", "--max_sequences", "2")
    model = gemma_cy.load(default_model, max_cache_len=512)
    try:
        browser.get(server.url + "/")
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "model").text.endswith(".gguf"))
        for field, value in (("temperature", "0"), ("max_tokens", "24")):
            element = browser.find_element(By.ID, field)
            element.clear()
            element.send_keys(value)
        browser.find_element(By.ID, "system").send_keys("Answer in one short sentence.")
        first = send(browser, "Name a color.", 1)
        assert browser.execute_script("return window.changes") > 3  # the reply arrived in pieces
        messages = [{"role": "system", "content": "Answer in one short sentence."},
                    {"role": "user", "content": "Name a color."}]
        want = model.chat_complete(messages, max_tokens=24, temperature=0, min_p=0.0)
        assert reply_of(browser, first) == want.text
        assert "tok/s" in first.find_element(By.CLASS_NAME, "stats").text
        second = send(browser, "And another one?", 2)
        messages += [{"role": "assistant", "content": want.text}, {"role": "user", "content": "And another one?"}]
        assert reply_of(browser, second) == model.chat_complete(messages, max_tokens=24, temperature=0,
                                                                min_p=0.0).text
        if SCREENSHOT:
            browser.save_screenshot(SCREENSHOT)
    finally:
        assert server.stop()[0] == 0
