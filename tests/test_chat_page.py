"""The chat page of `gemma-cy serve` (docs/server.md) in a real headless
browser: Debian's chromium driven by selenium, against one server (started
with --api_key) for the whole module. A typed message gets a reply streamed
into the page, the reply ``Model.chat_complete`` gives the same turn; the
Stop button frees the server's slot; chats survive a reload; the API key
field; markdown, rendered without ever running HTML from a message or a
reply; the token counts are the server's usage.

Replies that must say something exact are forced by the server itself: the
page's "custom JSON" field adds a ``grammar`` (llama.cpp's field) to the
request, and the real model, its tokens masked by the grammar, writes it."""
from __future__ import annotations

import json
import os
import re
import shutil
import time

import pytest

webdriver = pytest.importorskip("selenium.webdriver", reason="the chat page test needs selenium (make test "
                                                             "installs it)")
pytest.importorskip("fastapi", reason="gemma-cy serve needs its extra: pip install 'gemma-cy[server]'")
httpx = pytest.importorskip("httpx")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if CHROMIUM is None or DRIVER is None:
    pytest.skip("the chat page test needs chromium and its driver: apt-get install chromium chromium-driver "
                "(.ci/run installs them)", allow_module_level=True)

from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

import gemma_cy  # noqa: E402
from server_helpers import ServerProcess  # noqa: E402

pytestmark = pytest.mark.browser

SCREENSHOT = os.environ.get("GEMMA_CY_SCREENSHOT")  # where to save the page (docs/chat_page.png is one)
KEY = "chat-page-key"
XSS = '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script>'
CODE_QUESTION = "Fix this Python function:\n\n```python\ndef add(a, b):\n    return a - b\n```"


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(default_model):
    process = ServerProcess("-m", default_model, "--ctx", "1024", "--max_sequences", "2", "--api_key", KEY)
    yield process
    assert process.stop()[0] == 0


def fresh_page(browser, server, key: str | None = KEY):
    """The page with nothing saved in the browser, the API key typed in."""
    browser.get(server.url + "/")
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    if key is not None:
        type_into(browser, "api_key", key)
        WebDriverWait(browser, 30).until(lambda b: b.find_element(By.ID, "model").text.endswith(".gguf"))


def type_into(browser, field: str, value: str):
    element = browser.find_element(By.ID, field)
    element.clear()
    element.send_keys(value)


def set_value(browser, field: str, value: str):
    """A field's value as a paste would set it (newlines and all), the page told by an input event."""
    browser.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                           "e.dispatchEvent(new Event('input'))", field, value)


def force_reply(browser, text: str):
    """The next replies are ``text``: a grammar in the page's custom JSON field."""
    set_value(browser, "custom", json.dumps({"grammar": "root ::= " + json.dumps(text, ensure_ascii=False)}))


def send(browser, text: str, turn: int, state: str = "done"):
    """Sends ``text`` (Enter, as a user does); the reply's element once it
    is the ``turn``-th ``.assistant`` in ``state``. ``window.changes``
    counts the changes of the reply while it streamed."""
    set_value(browser, "input", text)
    browser.execute_script("""
        window.changes = 0;
        new MutationObserver((records) => {
            for (const r of records)
                if (r.target.closest && r.target.closest('.assistant[data-state=streaming]')) window.changes += 1;
        }).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});""")
    browser.find_element(By.ID, "input").send_keys(Keys.ENTER)
    WebDriverWait(browser, 120).until(
        lambda b: len(b.find_elements(By.CSS_SELECTOR, f".assistant[data-state={state}]")) == turn)
    return browser.find_elements(By.CSS_SELECTOR, ".assistant")[-1]


def saved_messages(browser) -> list[dict]:
    """The open chat's messages as the page keeps them (localStorage)."""
    return browser.execute_script("""
        const id = localStorage.getItem('gemma-cy.current');
        const chat = JSON.parse(localStorage.getItem('gemma-cy.chats') || '[]').find((c) => c.id === id);
        return chat ? chat.messages : null;""")


def chat_titles(browser) -> list[str]:
    return [e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, "#chats li .open")]


def live_sequences(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return float(re.search(r"^gemma_cy_live_sequences (\S+)$", text, re.M).group(1))


def test_a_typed_message_gets_a_streamed_reply(browser, server, default_model):
    model = gemma_cy.load(default_model, max_cache_len=512)
    fresh_page(browser, server)
    for field, value in (("temperature", "0"), ("max_tokens", "24")):
        type_into(browser, field, value)
    browser.find_element(By.ID, "system").send_keys("Answer in one short sentence.")
    first = send(browser, "Name a color.", 1)
    assert browser.execute_script("return window.changes") > 3  # the reply arrived in pieces
    messages = [{"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": "Name a color."}]
    want = model.chat_complete(messages, max_tokens=24, temperature=0, min_p=0.0)
    assert saved_messages(browser)[-1]["content"] == want.text and first.find_element(By.CLASS_NAME, "body").text
    assert "tok/s" in first.find_element(By.CLASS_NAME, "stats").text
    second = send(browser, "And another one?", 2)
    messages += [{"role": "assistant", "content": want.text}, {"role": "user", "content": "And another one?"}]
    assert saved_messages(browser)[-1]["content"] == model.chat_complete(messages, max_tokens=24, temperature=0,
                                                                         min_p=0.0).text
    assert second.find_element(By.CLASS_NAME, "body").text
    # the favicon is inline, so the browser asks the server for no /favicon.ico
    assert browser.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href").startswith(
        "data:image/svg+xml")
    assert 'endpoint="(unknown)"' not in httpx.get(server.url + "/metrics", timeout=10).text


def test_html_in_a_message_or_a_reply_is_text(browser, server):
    """The reply is forced by the real server (a grammar: the model's own
    tokens, masked), so it reaches the page as any reply does."""
    fresh_page(browser, server)
    link = "[click](javascript:window.pwned=3)"
    force_reply(browser, "Sure: " + XSS + " " + link)
    reply = send(browser, XSS + " " + link, 1)
    user = browser.find_element(By.CSS_SELECTOR, ".msg.user")

    def check():
        time.sleep(0.5)  # an <img> that failed to load would have run its onerror by now
        assert browser.execute_script("return window.pwned") is None
        assert not browser.find_elements(By.CSS_SELECTOR, "#log img, #log script, #log a")
        assert XSS in user.find_element(By.CLASS_NAME, "body").text
        assert XSS in reply.find_element(By.CLASS_NAME, "body").text and link in reply.text
    check()
    assert saved_messages(browser)[-1]["content"] == "Sure: " + XSS + " " + link
    browser.refresh()  # rendered again from what the browser saved
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-state=done]"))
    reply, user = (browser.find_element(By.CSS_SELECTOR, sel) for sel in (".msg.assistant", ".msg.user"))
    check()


def test_markdown_replies_and_code_blocks(browser, server):
    fresh_page(browser, server)
    markdown = ("## Steps\n\n1. **Bold** and *italic*\n2. `inline` code\n\n- a [link](https://example.com/docs)\n\n"
                "```python\nprint(\"<b>hi</b>\")\n```\n")
    force_reply(browser, markdown)
    reply = send(browser, "Some *markdown*, please.", 1)
    assert browser.find_element(By.CSS_SELECTOR, ".msg.user .body em").text == "markdown"
    body = reply.find_element(By.CLASS_NAME, "body")
    code = body.find_element(By.CSS_SELECTOR, "pre > code")
    assert code.text == 'print("<b>hi</b>")' and "language-python" in code.get_attribute("class")
    assert body.find_element(By.TAG_NAME, "h2").text == "Steps"
    assert [li.text for li in body.find_elements(By.CSS_SELECTOR, "ol > li")] == ["Bold and italic", "inline code"]
    assert body.find_element(By.CSS_SELECTOR, "ol strong").text == "Bold"
    assert body.find_element(By.CSS_SELECTOR, "ol em").text == "italic"
    assert body.find_element(By.CSS_SELECTOR, "ol code").text == "inline"
    a = body.find_element(By.CSS_SELECTOR, "ul a")
    assert a.text == "link" and a.get_attribute("href") == "https://example.com/docs"
    copy = body.find_element(By.CSS_SELECTOR, ".codebar button")
    copy.click()
    assert copy.text == "copied"


def test_stop_ends_the_reply_and_frees_the_slot(browser, server):
    fresh_page(browser, server)
    for field, value in (("temperature", "0"), ("max_tokens", "400")):
        type_into(browser, field, value)
    set_value(browser, "input", "Count to 100")  # Gemma 3 270M writes digits to the end of max_tokens
    browser.find_element(By.ID, "input").send_keys(Keys.ENTER)
    streaming = ".assistant[data-state=streaming] .body"
    WebDriverWait(browser, 60).until(lambda b: len(b.find_element(By.CSS_SELECTOR, streaming).text) > 10)
    assert live_sequences(server) == 1
    browser.find_element(By.ID, "stop").click()
    clicked = time.monotonic()
    while live_sequences(server) != 0:
        assert time.monotonic() - clicked < 1, "the server's slot was not freed within 1 s of Stop"
        time.sleep(0.05)
    WebDriverWait(browser, 5).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-state=stopped]"))
    reply = browser.find_element(By.CSS_SELECTOR, ".assistant[data-state=stopped]")
    assert "stopped" in reply.find_element(By.CLASS_NAME, "stats").text
    assert browser.find_element(By.ID, "send").is_enabled() and not browser.find_element(By.ID, "stop").is_displayed()
    kept = saved_messages(browser)[-1]
    assert kept["role"] == "assistant" and 10 < len(kept["content"]) < 300 and kept["stats"]["stopped"]


def test_chats_are_kept_listed_and_switched(browser, server):
    fresh_page(browser, server)
    for field, value in (("temperature", "0"), ("max_tokens", "8")):
        type_into(browser, field, value)
    send(browser, "Name a color.", 1)
    first = saved_messages(browser)
    browser.find_element(By.ID, "new_chat").click()
    assert not browser.find_elements(By.CSS_SELECTOR, "#log .msg")
    type_into(browser, "max_tokens", "18")  # Gemma 3 270M's reply: its fixed function in a code block
    send(browser, CODE_QUESTION, 1)
    second = saved_messages(browser)
    assert chat_titles(browser) == [" ".join(CODE_QUESTION.split())[:60], "Name a color."]  # the newest first

    browser.refresh()
    WebDriverWait(browser, 10).until(lambda b: len(chat_titles(b)) == 2)
    assert saved_messages(browser) == second
    assert browser.find_element(By.CSS_SELECTOR, "#chats li.active .open").text.startswith("Fix this Python")
    assert [e.get_attribute("class") for e in browser.find_elements(By.CSS_SELECTOR, "#log .msg")] == \
        ["msg user", "msg assistant"]
    assert browser.find_elements(By.CSS_SELECTOR, ".msg.user pre > code")

    browser.find_elements(By.CSS_SELECTOR, "#chats li .open")[1].click()  # back to the first chat
    assert saved_messages(browser) == first
    assert browser.find_element(By.CSS_SELECTOR, ".msg.user .body").text == "Name a color."
    type_into(browser, "max_tokens", "8")
    # edit the first message and send it again: the chat goes on from there
    browser.find_element(By.CSS_SELECTOR, ".msg.user .edit").click()
    editor = browser.find_element(By.CSS_SELECTOR, ".msg.user textarea.editor")
    editor.clear()
    editor.send_keys("Name a fruit.")
    browser.find_element(By.CSS_SELECTOR, ".msg.user .save").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-state=done]"))
    edited = saved_messages(browser)
    assert [m["role"] for m in edited] == ["user", "assistant"] and edited[0]["content"] == "Name a fruit."
    assert "Name a fruit." in chat_titles(browser)

    browser.find_element(By.CSS_SELECTOR, "#chats li:not(.active) .open").click()
    assert saved_messages(browser) == second
    type_into(browser, "max_tokens", "18")
    browser.find_element(By.CSS_SELECTOR, ".assistant .regenerate").click()  # greedy: the same reply again
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-state=done]"))
    assert [m["content"] for m in saved_messages(browser)] == [m["content"] for m in second]
    if SCREENSHOT:
        browser.save_screenshot(SCREENSHOT)

    browser.find_element(By.CSS_SELECTOR, "#chats li:not(.active) .delete").click()
    assert len(chat_titles(browser)) == 1 and saved_messages(browser)[0]["content"] == CODE_QUESTION
    browser.refresh()
    WebDriverWait(browser, 10).until(lambda b: b.find_elements(By.CSS_SELECTOR, "#log .msg"))
    assert len(chat_titles(browser)) == 1


def test_the_api_key_field(browser, server):
    fresh_page(browser, server, key=None)
    WebDriverWait(browser, 10).until(lambda b: "401" in b.find_element(By.ID, "status").text)
    type_into(browser, "api_key", "not-the-key")
    type_into(browser, "max_tokens", "4")
    set_value(browser, "input", "Hello")
    browser.find_element(By.ID, "input").send_keys(Keys.ENTER)
    WebDriverWait(browser, 30).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".msg.error"))
    error = browser.find_element(By.CSS_SELECTOR, ".msg.error").text
    assert "401" in error and "a missing or wrong API key" in error
    type_into(browser, "api_key", KEY)
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.ID, "model").text.endswith(".gguf"))
    assert browser.find_element(By.ID, "status").text == ""
    browser.find_element(By.CSS_SELECTOR, ".msg.error .retry").click()
    WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.CSS_SELECTOR, ".assistant[data-state=done]"))
    assert not browser.find_elements(By.CSS_SELECTOR, ".msg.error")
    browser.refresh()  # the key is kept in the browser
    WebDriverWait(browser, 10).until(lambda b: b.find_element(By.ID, "model").text.endswith(".gguf"))
    assert browser.find_element(By.ID, "api_key").get_attribute("value") == KEY


CAPTURE = """
    window.captured = [];
    const original = window.fetch;
    window.fetch = async (url, init) => {
        const response = await original(url, init);
        if (String(url).endsWith('/v1/chat/completions')) {
            const record = {body: JSON.parse(init.body), stream: null};
            window.captured.push(record);
            response.clone().text().then((text) => { record.stream = text; });
        }
        return response;
    };"""


def test_token_counts_are_the_usage_chunks(browser, server):
    """Hieroglyphs are byte tokens, several to a character: the stream has
    fewer chunks than the reply has tokens, and the page shows the tokens."""
    fresh_page(browser, server)
    browser.execute_script(CAPTURE)
    force_reply(browser, "𓀀𓀁𓀂 done")
    reply = send(browser, "Write three hieroglyphs.", 1)
    WebDriverWait(browser, 5).until(lambda b: b.execute_script("return window.captured[0].stream"))
    sent, stream = browser.execute_script("return [window.captured[0].body, window.captured[0].stream]")
    assert sent["stream_options"] == {"include_usage": True}
    chunks = [json.loads(line[6:]) for line in stream.split("\n") if line.startswith("data: {")]
    usage = chunks[-1]["usage"]
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert usage["completion_tokens"] > len([t for t in texts if t])
    stats = reply.find_element(By.CLASS_NAME, "stats").text
    assert f"{usage['completion_tokens']} tokens (prompt {usage['prompt_tokens']})" in stats and "tok/s" in stats


def test_sampling_fields_and_json_mode_are_sent(browser, server):
    fresh_page(browser, server)
    browser.execute_script(CAPTURE)
    for field, value in (("temperature", "0.5"), ("top_p", "0.9"), ("top_k", "40"), ("min_p", "0.05"),
                         ("max_tokens", "30"), ("seed", "7")):
        type_into(browser, field, value)
    browser.find_element(By.ID, "json_mode").click()
    reply = send(browser, "A JSON object with a name, please.", 1)
    sent = browser.execute_script("return window.captured[0].body")
    assert {k: sent[k] for k in ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed")} == \
        {"temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "max_tokens": 30, "seed": 7}
    assert sent["response_format"] == {"type": "json_object"} and sent["stream"] is True
    assert saved_messages(browser)[-1]["content"].startswith("{") and reply.text
