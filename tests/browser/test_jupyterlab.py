"""The course in a real browser: JupyterLab started by the README's `make lab`, driven by
headless Chromium through chromedriver (selenium).

Run by `make test-browser` only (tests/conftest.py keeps this folder out of `make test`).
It opens 00 and 03, runs every cell, finds no error output, answers quiz questions wrong and
right, moves the calculator's controls, and writes a screenshot of each stage to
_build/browser/. Nothing is saved into the notebooks (autosave off, a hash check), and
JupyterLab, its kernels and Chromium are stopped whatever happens.

Needs Chromium and its chromedriver (Debian/Ubuntu: `apt-get install chromium chromium-driver`);
CHROMIUM and CHROMEDRIVER name other paths. Selenium Manager never runs (the driver's path
is given), so nothing is downloaded.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "_build" / "browser"
NOTEBOOKS = ROOT / "notebooks"
NB00, NB03 = "00_orientation.ipynb", "03_memory_anatomy.ipynb"
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver") or "/usr/bin/chromedriver"
INSTALL_HINT = ("install them with `sudo apt-get install chromium chromium-driver` (Debian/Ubuntu), "
                "or point CHROMIUM and CHROMEDRIVER at a Chromium and its matching chromedriver")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1000"]
WIDE, NARROW, HEIGHT = 1400, 1000, 1000
os.environ["SE_OFFLINE"] = "true"      # belt and braces: Selenium Manager must never download


# ------------------------------------------------------------------------ the check list

class Checks:
    """One line per check, printed as it is decided; the test fails if any failed."""

    def __init__(self):
        self.rows: list[tuple[bool, str, str]] = []

    def __call__(self, name: str, ok: bool, detail: str = "") -> bool:
        self.rows.append((bool(ok), name, detail))
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return bool(ok)

    def attempt(self, name: str, fn, *args, browser=None):
        """Run ``fn``; an exception is this check's failure (with a screenshot of the page,
        FAILED_*.png), not the end of the test."""
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - reported as a failed check
            self(name, False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            if browser is not None:
                with contextlib.suppress(Exception):
                    browser.driver.save_screenshot(str(OUT / f"FAILED_{name[:2]}_{name[4:].replace(' ', '_')}.png"))
            return None

    @property
    def failed(self):
        return [name for ok, name, _ in self.rows if not ok]


# ------------------------------------------------------------------------ processes

def _tree(pid: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(procs) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def _stop(procs, grace: float = 5.0):
    """SIGTERM, then SIGKILL after ``grace`` seconds, to exactly these processes."""
    procs = _alive(procs)
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, left = psutil.wait_procs(procs, timeout=grace)
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(left, timeout=grace)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """`make lab LAB_ARGS=...` on loopback with a random token and a throwaway settings,
    workspace, checkpoint and runtime directory (autosave off: nothing is written into
    notebooks/)."""

    def __init__(self, tmp: Path):
        self.port, self.token = _free_port(), secrets.token_hex(16)
        settings = tmp / "lab-settings" / "@jupyterlab"
        for plugin, values in {"docmanager-extension/plugin": {"autosave": False},
                               "apputils-extension/notification": {"fetchNews": "false",
                                                                   "checkForUpdates": False}}.items():
            path = settings / f"{plugin}.jupyterlab-settings"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        args = ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
                f"--IdentityProvider.token={self.token}", "--expose-app-in-browser",
                f"--LabApp.user_settings_dir={tmp / 'lab-settings'}",
                f"--LabApp.workspaces_dir={tmp / 'lab-workspaces'}",
                f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}"]
        self.command = ["make", "--no-print-directory", "lab", "LAB_ARGS=" + " ".join(map(shlex.quote, args))]
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        env.update(JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), CUDA_VISIBLE_DEVICES="")
        self.log_path = OUT / "jupyterlab.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.command, cwd=ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def remember(self):
        """Note every process of the server's tree (its kernels outlive a dead parent)."""
        for p in _tree(self.proc.pid):
            self.seen.setdefault(p.pid, p)

    def api(self, path: str, method: str = "GET", timeout: float = 5.0):
        req = urllib.request.Request(self.url + path, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read()
            return json.loads(body) if body else None

    def wait_ready(self, timeout: float = 240.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"`make lab` exited with {self.proc.returncode}; its log: "
                                   + " | ".join(self.log().splitlines()[-5:]))
            with contextlib.suppress(OSError, ValueError):
                self.api("/api/status", timeout=2)
                self.remember()
                return time.monotonic() - t0
            time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer on {self.url} within {timeout:.0f} s")

    def stop(self):
        self.remember()
        with contextlib.suppress(Exception):
            self.api("/api/shutdown", method="POST")      # shuts its kernels down too
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=20)
        _stop([*self.seen.values(), *_tree(self.proc.pid)])
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._log.close()

    def leftovers(self) -> list[str]:
        return [f"{p.pid} {p.name()}" for p in _alive([*self.seen.values(), *_tree(self.proc.pid)])]


class Browser:
    """Headless Chromium through chromedriver; the viewport is exactly width x height."""

    def __init__(self, tmp: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp / 'chromium-profile'}"]:
            opts.add_argument(flag)
        self.service = Service(CHROMEDRIVER, log_output=str(OUT / "chromedriver.log"))
        self.driver = None
        self.seen: dict[int, psutil.Process] = {}
        self.driver = webdriver.Chrome(service=self.service, options=opts)
        self.remember()
        self.driver.set_script_timeout(600)

    def remember(self):
        proc = getattr(self.service, "process", None)
        if proc is not None:
            for p in _tree(proc.pid):
                self.seen.setdefault(p.pid, p)

    def viewport(self, width: int, height: int = HEIGHT):
        d = self.driver
        d.set_window_size(width, height)
        w, h = d.execute_script("return [window.innerWidth, window.innerHeight]")
        d.set_window_size(2 * width - w, 2 * height - h)
        time.sleep(0.5)

    def stop(self):
        self.remember()
        if self.driver is not None:
            with contextlib.suppress(Exception):
                self.driver.quit()
        _stop(list(self.seen.values()))

    def leftovers(self) -> list[str]:
        return [f"{p.pid} {p.name()}" for p in _alive(self.seen.values())]


# ------------------------------------------------------------------------ JupyterLab, from the page

JS_OPEN_AND_RUN = """
const [path, done] = arguments;
(async () => {
  const app = window.jupyterapp;
  await app.restored;
  const panel = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  await panel.context.ready;
  await panel.sessionContext.ready;
  app.shell.activateById(panel.id);
  await app.commands.execute('notebook:clear-all-cell-outputs');
  const t0 = performance.now();
  const ok = await app.commands.execute('notebook:run-all-cells');
  done({ok, seconds: (performance.now() - t0) / 1000,
        kernel: panel.sessionContext.session.kernel.name});
})().catch(e => done({error: String(e && e.stack || e)}));
"""

# Every code cell of the current notebook's model: its count and its outputs.
JS_MODEL = """
const panel = window.jupyterapp.shell.currentWidget;
const m = panel.content.model, cells = [];
for (let i = 0; i < m.cells.length; i++) {
  const c = m.cells.get(i);
  if (c.type !== 'code') continue;
  cells.push({index: i, count: c.executionCount, source: c.sharedModel.getSource(),
              outputs: c.outputs.toJSON().map(o => ({type: o.output_type, name: o.name || '',
                 ename: o.ename || '', evalue: o.evalue || '',
                 text: typeof o.text === 'string' ? o.text : (o.text || []).join('')}))});
}
return {path: panel.context.path, dirty: m.dirty, cells};
"""

JS_KERNEL_PYTHON = """
const done = arguments[arguments.length - 1];
const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
const future = kernel.requestExecute({code: '', silent: true,
    user_expressions: {exe: "__import__('sys').executable"}});
future.done.then(r => done(r.content.user_expressions.exe.data['text/plain']))
      .catch(e => done('error: ' + e));
"""

# The output node of cell `index` of the current notebook, scrolled into view.
JS_CELL_OUTPUT = """
const [index, done] = arguments;
const nb = window.jupyterapp.shell.currentWidget.content;
Promise.resolve(nb.scrollToItem(index, 'start')).then(() => {
  const node = nb.widgets[index].node.querySelector('.jp-OutputArea');
  node.scrollIntoView({block: 'start'});
  setTimeout(() => done(node), 300);
});
"""

# The calculator's state in the kernel (to tell a kernel-side race from a frontend one).
JS_CALCULATOR_STATE = """
const done = arguments[arguments.length - 1];
const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
kernel.requestExecute({code: '', silent: true, user_expressions: {s: "[(c.controls['model'].value, "
    + "c.controls['custom_billions'].value, [o.get('text', '')[:40] for o in c.out.outputs]) "
    + "for c in __import__('gc').get_objects() if type(c).__name__ == 'Calculator']"}})
  .done.then(r => done(r.content.user_expressions.s.data['text/plain'])).catch(e => done(String(e)));
"""

JS_CLOSE_CURRENT = """
const done = arguments[arguments.length - 1];
const panel = window.jupyterapp.shell.currentWidget;
panel.sessionContext.shutdown().then(() => { panel.context.model.dirty = false; panel.dispose(); done(true); })
  .catch(e => done('error: ' + e));
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _cell_index(model: dict, needle: str) -> int:
    hits = [c["index"] for c in model["cells"] if needle in c["source"]]
    if not hits:
        raise LookupError(f"no code cell contains {needle!r}")
    return hits[0]


def _wait(fn, timeout: float = 30.0, what: str = "condition", state=None):
    """Poll ``fn`` until it returns a truthy value; that value. ``state()``: what to say
    about the page when it times out."""
    t0, last = time.monotonic(), None
    while time.monotonic() - t0 < timeout:
        with contextlib.suppress(Exception):
            last = fn()
            if last:
                return last
        time.sleep(0.25)
    have = ""
    if state is not None:
        with contextlib.suppress(Exception):
            have = f"; have {state()}"
    raise TimeoutError(f"waited {timeout:.0f} s for {what}{have}")


# ------------------------------------------------------------------------ the checks

def run_notebook(b: Browser, lab: Lab, name: str, check: Checks) -> dict | None:
    d = b.driver
    res = d.execute_async_script(JS_OPEN_AND_RUN, name)
    lab.remember()
    if "error" in res:
        check(f"{name[:2]}: run all cells", False, res["error"].splitlines()[0])
        return None
    model = d.execute_script(JS_MODEL)
    code = model["cells"]
    unrun = [c["index"] for c in code if c["count"] is None]
    errors = [f"cell {c['index']}: {o['ename']}: {o['evalue']}" for c in code for o in c["outputs"]
              if o["type"] == "error"]
    stderr = [f"cell {c['index']}: {o['text'].strip()[:80]}" for c in code for o in c["outputs"]
              if o["type"] == "stream" and o["name"] == "stderr"]
    check(f"{name[:2]}: run all cells", res["ok"] and not unrun,
          f"{len(code)} code cells in {res['seconds']:.1f} s, kernel {res['kernel']}"
          + (f"; not run: cells {unrun}" if unrun else ""))
    check(f"{name[:2]}: no error output in the notebook model", not errors, "; ".join(errors[:3]))
    check(f"{name[:2]}: no stderr output in the notebook model", not stderr, "; ".join(stderr[:3]))
    exe = d.execute_async_script(JS_KERNEL_PYTHON).strip("'\"")
    check(f"{name[:2]}: the kernel is the .venv's Python", exe.startswith(str(ROOT / ".venv")), exe)
    broken = d.execute_script(
        "return [...document.querySelectorAll('.jp-OutputArea-output')]"
        ".map(n => n.textContent).filter(t => /Error displaying widget|Loading widget|model not found/.test(t))"
        ".map(t => t.slice(0, 80))")
    check(f"{name[:2]}: every widget output rendered", not broken, "; ".join(broken[:2]))
    return model


def _output(b: Browser, model: dict, needle: str):
    return b.driver.execute_async_script(JS_CELL_OUTPUT, _cell_index(model, needle))


def _rows(quiz):
    from selenium.webdriver.common.by import By
    return quiz.find_elements(By.CSS_SELECTOR, ":scope > .widget-vbox")


def _quiz_box(b: Browser, model: dict):
    from selenium.webdriver.common.by import By
    out = _output(b, model, "quiz.show(")
    return _wait(lambda: out.find_element(By.CSS_SELECTOR, ".jp-OutputArea-output > .widget-vbox"),
                 what="the quiz form")


def _texts(el, css: str) -> list[str]:
    from selenium.webdriver.common.by import By
    return [e.text for e in el.find_elements(By.CSS_SELECTOR, css)]


def _feedback(row) -> str:
    from selenium.webdriver.common.by import By
    return row.find_elements(By.CSS_SELECTOR, ":scope > .widget-html .widget-html-content")[-1].text


def _score(quiz) -> str:
    return _texts(quiz, ":scope > .widget-html .widget-html-content")[1]


def _click(b: Browser, el):
    b.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
    el.click()


def _type(b: Browser, field, text: str):
    """Replace what ``field`` holds by ``text`` and press Enter, as a learner does."""
    from selenium.webdriver.common.keys import Keys

    _click(b, field)
    for _ in range(3):
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.BACKSPACE)
        if field.get_attribute("value") == "":
            break
        time.sleep(0.2)
    field.send_keys(text, Keys.ENTER)


def _shot(b: Browser, name: str, el=None, block: str = "center", still=None) -> Path:
    """A screenshot with ``el`` scrolled into view, once the page has painted. ``still``:
    the condition the picture should show, checked again after it was taken (the page
    must not have changed back meanwhile)."""
    if el is not None:
        b.driver.execute_script(f"arguments[0].scrollIntoView({{block: '{block}'}})", el)
    time.sleep(0.5)
    b.driver.execute_async_script(
        "const done = arguments[0]; requestAnimationFrame(() => requestAnimationFrame(() => done()))")
    path = OUT / name
    b.driver.save_screenshot(str(path))
    if still is not None:
        time.sleep(1.0)
        if not still():
            raise AssertionError(f"the page changed after {name} was taken")
    return path


def _cell(b: Browser, el):
    return b.driver.execute_script("return arguments[0].closest('.jp-Cell')", el)


def _expect(row, prefix: str, timeout: float = 20.0) -> str:
    return _wait(lambda: (t := _feedback(row)).startswith(prefix) and t, timeout,
                 f"feedback starting {prefix!r} (have {_feedback(row)!r})")


def quiz_00(b: Browser, model: dict, check: Checks):
    from selenium.webdriver.common.by import By

    from course_utils.course import quiz as quizmod

    questions = quizmod.get("00").questions
    quiz = _quiz_box(b, model)
    rows = _rows(quiz)
    check("00: quiz is a live form (not its text fallback)", len(rows) == len(questions),
          f"{len(rows)} question rows, {len(_texts(quiz, 'button'))} Check buttons; {_score(quiz)!r}")

    # A number question: text that is not a number, then the right number (Enter checks).
    n = next(i for i, q in enumerate(questions) if isinstance(q, quizmod.Numeric))
    row = rows[n]
    field = row.find_element(By.CSS_SELECTOR, "input")
    _type(b, field, "twenty")
    text = _expect(row, "Try again:")
    check(f"00: question {n + 1}, 'twenty' -> 'Try again:'", "not a number" in text, text)
    _shot(b, "00_quiz_try_again.png", row, still=lambda: _feedback(row).startswith("Try again:"))
    _type(b, field, f"{questions[n].answer:g}")
    text = _expect(row, "Correct.")
    check(f"00: question {n + 1}, {questions[n].answer:g} -> 'Correct.'", True, text)

    # A one-answer question: a wrong option, Check; then the right one, Check.
    k = next(i for i, q in enumerate(questions) if isinstance(q, quizmod.SingleChoice))
    q, row = questions[k], rows[k]
    right = sorted(q.answer)[0]
    wrong = next(c for c in q.letters if c != right)
    labels = {lab.text[1]: lab for lab in row.find_elements(By.CSS_SELECTOR, ".widget-radio-box label")}
    button = row.find_element(By.CSS_SELECTOR, "button")
    _click(b, labels[wrong])
    _click(b, button)
    text = _expect(row, "Not quite.")
    check(f"00: question {k + 1}, ({wrong}) + Check -> 'Not quite.'", True, text[:90])
    _shot(b, "00_quiz_wrong.png", row, still=lambda: _feedback(row).startswith("Not quite."))
    _click(b, labels[right])
    _click(b, button)
    text = _expect(row, "Correct.")
    check(f"00: question {k + 1}, ({right}) + Check -> 'Correct.'", True, text[:90])
    want = f"Score: 2 / {len(questions)} correct (2 answered)"
    score = _wait(lambda: _score(quiz) == want and want, 10, f"score {want!r}")
    check("00: score line counts both right answers", score == want, score)
    _shot(b, "00_quiz_right.png", quiz, "start", still=lambda: _score(quiz) == want)


def quiz_03(b: Browser, model: dict, check: Checks):
    from selenium.webdriver.common.by import By

    from course_utils.course import quiz as quizmod

    questions = quizmod.get("03").questions
    quiz = _quiz_box(b, model)
    rows = _rows(quiz)
    check("03: quiz is a live form", len(rows) == len(questions), f"{len(rows)} question rows")
    # The number to pick (question 4): the typical mistake (activations sharded like the states), then the right one.
    k = next(i for i, q in enumerate(questions) if isinstance(q, quizmod.SingleChoice) and "move to ZeRO-3" in q.prompt)
    q, row = questions[k], rows[k]
    right = sorted(q.answer)[0]
    wrong = q.letters[q.options.index("1.875 GB")]
    labels = {lab.text[1]: lab for lab in row.find_elements(By.CSS_SELECTOR, ".widget-radio-box label")}
    button = row.find_element(By.CSS_SELECTOR, "button")
    _click(b, labels[wrong])
    _click(b, button)
    text = _expect(row, "Not quite.")
    check(f"03: question {k + 1}, ({wrong}) 1.875 GB -> 'Not quite.'", True, text[:90])
    _click(b, labels[right])
    _click(b, button)
    text = _expect(row, "Correct.")
    check(f"03: question {k + 1}, ({right}) {q.options[q.letters.index(right)]} -> 'Correct.'", True, text[:90])


JS_CONTROL = """
const [box, label] = arguments;
const hit = [...box.querySelectorAll('.widget-label')].find(l => l.textContent.trim() === label);
return hit ? hit.parentElement : null;
"""


def _calc(b: Browser, model: dict):
    from selenium.webdriver.common.by import By
    out = _output(b, model, "calculator.show(")
    return _wait(lambda: out.find_element(By.CSS_SELECTOR, ".jp-OutputArea-output > .widget-vbox"),
                 what="the calculator")


def _calc_output(box) -> tuple[str, str]:
    """(the PNG's src, the text) that the calculator's Output widget shows."""
    from selenium.webdriver.common.by import By
    out = box.find_element(By.CSS_SELECTOR, ".widget-output")
    imgs = out.find_elements(By.CSS_SELECTOR, "img")
    return (imgs[0].get_attribute("src") if imgs else "",
            "\n".join(e.text for e in out.find_elements(By.CSS_SELECTOR, "pre")))


def calculator_03(b: Browser, model: dict, check: Checks):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    d = b.driver
    box = _calc(b, model)
    control = lambda label: d.execute_script(JS_CONTROL, box, label)  # noqa: E731
    src0, text0 = _wait(lambda: (r := _calc_output(box))[0] and r, what="the calculator's figure")
    first = text0.splitlines()[0] if text0 else ""
    check("03: calculator shows a PNG figure and a table", src0.startswith("data:image/png") and "4 GPUs" in first,
          first)
    _shot(b, "03_calculator_before.png", _cell(b, box), "start")

    Select(control("GPUs").find_element(By.CSS_SELECTOR, "select")).select_by_visible_text("8")
    src1, text1 = _wait(lambda: (r := _calc_output(box))[1].startswith(first.replace("4 GPUs", "8 GPUs")) and r,
                        what="'8 GPUs' in the table")
    check("03: GPUs 4 -> 8 redraws figure and table", src1 != src0, text1.splitlines()[0])
    stage_buttons = control("stage").find_elements(By.CSS_SELECTOR, "button")
    zero1 = next(x for x in stage_buttons if x.text.strip() == "ZeRO-1")
    _click(b, zero1)
    def marked_zero1():
        r = _calc_output(box)
        return any(line.startswith("ZeRO-1") and line.endswith("<-") for line in r[1].splitlines()) and r

    src2, text2 = _wait(marked_zero1, what="the table's '<-' on ZeRO-1")
    check("03: stage toggle ZeRO-3 -> ZeRO-1 moves the table's marker", src2 != src1,
          next(line for line in text2.splitlines() if line.endswith("<-")))
    _shot(b, "03_calculator_after.png", _cell(b, box), "start", still=lambda: _calc_output(box) == (src2, text2))

    custom = control("custom (billions)").find_element(By.CSS_SELECTOR, "input")
    was_disabled = custom.get_attribute("disabled") is not None
    Select(control("model").find_element(By.CSS_SELECTOR, "select")).select_by_visible_text("custom size")
    _wait(lambda: custom.get_attribute("disabled") is None, 10, "the custom box to be enabled")
    check("03: 'custom (billions)' disabled for a preset, enabled for 'custom size'", was_disabled)
    # As a learner does: see the figure for the custom size before typing a new one. (Typing
    # within ~0.1 s of picking "custom size", while the kernel still draws, lost the typed
    # value or the error message in 3 of ~25 runs: reported, not what this check is about.)
    _wait(lambda: _calc_output(box)[1].startswith("7B custom"), 30, "the figure for '7B custom'")
    _type(b, custom, "0")
    text = _wait(lambda: (t := _calc_output(box)[1]).startswith("Change the inputs:") and t, 30,
                 "'Change the inputs:'", lambda: f"box {custom.get_attribute('value')!r}, output "
                 f"{_calc_output(box)[1][:60]!r}; in the kernel: {d.execute_async_script(JS_CALCULATOR_STATE)}")
    check("03: custom size 0 -> 'Change the inputs: ...'",
          "the custom size must be a positive number" in text, text.strip()[:100])
    try:
        _shot(b, "03_calculator_custom_zero.png", _cell(b, box), "start",
              still=lambda: _calc_output(box)[1].startswith("Change the inputs:"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}: the page shows {_calc_output(box)[1].splitlines()[0]!r} beside "
                             f"{custom.get_attribute('value')!r}; in the kernel: {d.execute_async_script(JS_CALCULATOR_STATE)}")
    _type(b, custom, "13")
    src3, text3 = _wait(lambda: "13B custom" in (r := _calc_output(box))[1] and r, 20, "'13B custom'")
    check("03: custom size 13 -> figure and table again", src3.startswith("data:image/png"),
          text3.splitlines()[0])


JS_LAYOUT = """
const box = arguments[0];
const area = box.closest('.jp-OutputArea-output').getBoundingClientRect();
const panel = window.jupyterapp.shell.currentWidget.node.getBoundingClientRect();
const right = Math.min(area.right, panel.right);
const controls = [...box.querySelectorAll(':scope > .widget-hbox > .widget-vbox > *')];
const cut = controls.filter(c => { const r = c.getBoundingClientRect();
  return r.width === 0 || r.left < area.left - 1 || r.right > right + 1; })
  .map(c => (c.querySelector('.widget-label') || c).textContent.trim() || c.className);
const cols = [...box.querySelectorAll(':scope > .widget-hbox > .widget-vbox')].map(c => c.getBoundingClientRect());
return {controls: controls.length, cut, output_width: Math.round(area.width),
        wrapped: cols.length === 2 && cols[1].top >= cols[0].bottom - 1,
        left_panel: window.jupyterapp.shell.leftCollapsed === false,
        sidebar_width: Math.round(document.querySelector('#jp-left-stack').getBoundingClientRect().width),
        scroll: box.scrollWidth > box.clientWidth + 1,
        // cosmetic, reported: a description wrapped above its control; table lines wrapped
        label_above: [...box.querySelectorAll('.widget-label')].filter(l => {
          const c = l.nextElementSibling, r = l.getBoundingClientRect();
          return c && r.height > 0 && l.textContent.replace(/[\\s\\u200b]/g, '') &&
            c.getBoundingClientRect().top >= r.bottom - 1; })
          .map(l => l.textContent.trim()),
        table_wraps: [...box.querySelectorAll('.widget-output pre')].some(p => {
          const range = document.createRange(); range.selectNodeContents(p);
          const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
          return tops.size > p.textContent.replace(/\\n$/, '').split('\\n').length; })};
"""


def narrow_03(b: Browser, model: dict, check: Checks):
    d = b.driver
    d.execute_script("window.jupyterapp.shell.activateById('filebrowser')")
    for width in (WIDE, NARROW):
        b.viewport(width)
        box = _calc(b, model)
        lay = d.execute_script(JS_LAYOUT, box)
        ok = lay["left_panel"] and lay["controls"] == 13 and not lay["cut"] and not lay["scroll"]
        check(f"03: calculator at {width} px, file browser open: no control cut off", ok,
              f"{lay['controls']} controls, output {lay['output_width']} px wide beside a "
              f"{lay['sidebar_width']} px side panel, columns {'wrapped' if lay['wrapped'] else 'side by side'}"
              + (f"; cut off: {lay['cut']}" if lay["cut"] else "") + ("; scrolls sideways" if lay["scroll"] else "")
              + (f"; labels above their buttons: {lay['label_above']}" if lay["label_above"] else "")
              + ("; the table's lines wrap" if lay["table_wraps"] else ""))
        if width == NARROW:
            _shot(b, "03_calculator_1000px_sidebar.png", _cell(b, box), "start")
    b.viewport(WIDE)


# ------------------------------------------------------------------------ the test

def test_jupyterlab_in_chromium(no_leftover_children):
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if missing:
        pytest.fail(f"not found: {', '.join(missing)}; {INSTALL_HINT}", pytrace=False)
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.png"):
        old.unlink()
    t0 = time.monotonic()
    check = Checks()
    hashes = {nb: _sha(NOTEBOOKS / nb) for nb in (NB00, NB03)}
    had_checkpoints = (NOTEBOOKS / ".ipynb_checkpoints").exists()
    lab = browser = None
    with tempfile.TemporaryDirectory(prefix="course-browser-") as tmp:
        tmp = Path(tmp)
        try:
            lab = Lab(tmp)
            secs = check.attempt("make lab starts", lab.wait_ready)
            if secs is not None:
                log = lab.log()
                check("make lab starts" + (" (as root)" if os.getuid() == 0 else ""),
                      "Running as root is not recommended" not in log,
                      f"{lab.url} answered after {secs:.1f} s: {' '.join(lab.command[:3])} LAB_ARGS=...")
                browser = check.attempt("Chromium starts", Browser, tmp)
            if browser is not None:
                b, d = browser, browser.driver
                b.viewport(WIDE)
                d.get(f"{lab.url}/lab?token={lab.token}")
                _wait(lambda: d.execute_script("return !!(window.jupyterapp && window.jupyterapp.started)"),
                      120, "window.jupyterapp")
                check("JupyterLab loads in Chromium", True,
                      f"JupyterLab {d.execute_script('return window.jupyterapp.version')}, "
                      f"Chromium {d.capabilities.get('browserVersion', '?')}")
                model = check.attempt("00: run all cells", run_notebook, b, lab, NB00, check, browser=b)
                if model:
                    check.attempt("00: quiz", quiz_00, b, model, check, browser=b)
                    d.execute_async_script(JS_CLOSE_CURRENT)
                model = check.attempt("03: run all cells", run_notebook, b, lab, NB03, check, browser=b)
                if model:
                    check.attempt("03: calculator", calculator_03, b, model, check, browser=b)
                    check.attempt("03: quiz", quiz_03, b, model, check, browser=b)
                    check.attempt("03: calculator layout", narrow_03, b, model, check, browser=b)
                    check("03: notebook model left unsaved (dirty) in the browser",
                          d.execute_script(JS_MODEL)["dirty"])
        finally:
            if browser is not None:
                browser.stop()
            if lab is not None:
                lab.stop()
        if lab is not None:
            saved = [line for line in lab.log().splitlines() if "Saving file" in line]
            changed = [nb for nb, h in hashes.items() if _sha(NOTEBOOKS / nb) != h]
            check("nothing written into notebooks/", not saved and not changed
                  and (had_checkpoints or not (NOTEBOOKS / ".ipynb_checkpoints").exists()),
                  "; ".join(saved + [f"{nb} changed on disk while the test ran"
                                     + ("" if saved else " (JupyterLab saved nothing: another process?)")
                                     for nb in changed]))
            left = lab.leftovers() + (browser.leftovers() if browser else [])
            check("JupyterLab, kernels and Chromium stopped", not left, ", ".join(left))
    shots = sorted(p.name for p in OUT.glob("*.png"))
    print(f"screenshots in {OUT.relative_to(ROOT)}/: {', '.join(shots)}")
    print(f"{len(check.rows) - len(check.failed)} of {len(check.rows)} checks ok in "
          f"{time.monotonic() - t0:.0f} s")
    assert not check.failed, f"failed: {check.failed}"
