#!/usr/bin/python3
"""The explorer in a real browser (ctest explore_browser; docs/gallery.md, "The explorer").

Writes the pages of examples/transformer_fsdp_tp_sp.json, of a failing bug and of two runs side by
side with `meshsim explore`, opens each in headless Chromium through Selenium (Debian's chromium,
chromium-driver and python3-selenium), drives it as a person would (opens a layer, clicks a value,
steps forward, sorts the communication table) and asserts what the page shows; a refused run's
page opens with its error; the 1,024-rank transformer's page is under 5 MB and loads in under 2 s,
the 8-rank one's under 1 MB (issue 34's bar). Exits 77 (ctest's
SKIP_RETURN_CODE) with a message where Chromium, its driver or Selenium is missing.

  explore_browser.py MESHSIM SOURCE_DIR WORK_DIR [--screenshots DIR] [--time PAGE.html ...]

--screenshots writes the gallery's pictures; --time prints how long each page takes to load (the
figures of docs/performance.md).
"""
import json
import os
import shutil
import subprocess
import sys
import time

SKIP = 77
SOURCE = "."  # the source tree (main's second argument)


def skip(why):
    print("SKIP: " + why + " (scripts/setup.sh installs chromium, chromium-driver and python3-selenium)")
    sys.exit(SKIP)


try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:
    skip("python3-selenium is not installed")

CHROMIUM = shutil.which("chromium")
DRIVER = shutil.which("chromedriver")
if not CHROMIUM or not DRIVER:
    skip("headless Chromium is not installed (chromium and chromedriver not found on PATH)")


def fail(why):
    print("FAIL: " + why)
    sys.exit(1)


def check(cond, why):
    if not cond:
        fail(why)


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def load(drv, page):
    start = time.monotonic()
    drv.get("file://" + os.path.abspath(page))
    for _ in range(600):
        if drv.execute_script("return document.body && document.body.dataset.ready === '1'"):
            break
        time.sleep(0.01)
    else:
        errors = [e["message"] for e in drv.get_log("browser")]
        fail(page + ": the page never became ready; console: " + "; ".join(errors))
    elapsed = time.monotonic() - start
    errors = [e["message"] for e in drv.get_log("browser") if e["level"] == "SEVERE"]
    check(not errors, page + ": errors in the console: " + "; ".join(errors))
    return elapsed


def text(drv, css):
    return drv.find_element(By.CSS_SELECTOR, css).text


def node(drv, node_id):
    found = drv.find_elements(By.CSS_SELECTOR, 'g.node[data-id="%s"]' % node_id)
    check(found, "no node %s in the graph" % node_id)
    return found[0]


def explore(meshsim, files, page):
    rc = subprocess.run([meshsim, "explore", *files, "-o", page], capture_output=True, text=True)
    check(rc.returncode == 0, "meshsim explore %s: exit %d: %s" % (files, rc.returncode, rc.stderr))


def transformer(drv, page, shots):
    load(drv, page)
    check(text(drv, "#status") == "pass", "transformer: status " + text(drv, "#status"))
    model = json.loads(drv.execute_script("return document.getElementById('meshsim-model').textContent"))
    layers = model["runs"][0]["layers"]
    check(len(layers) >= 2, "transformer: expected its layers folded, got " + str(layers))
    folds = drv.find_elements(By.CSS_SELECTOR, 'g.node[data-id^="g"]')
    check(len(folds) == len(layers), "transformer: %d fold nodes for %d layers" % (len(folds), len(layers)))
    # Open layer l0: its ops are drawn, the breadcrumb names it.
    k = layers.index("layer l0")
    node(drv, "g%d" % k).click()
    check("layer l0" in text(drv, "#breadcrumb"), "after opening l0 the breadcrumb says " + text(drv, "#breadcrumb"))
    # Click the value l0_q: its placements per axis, shapes and one mesh cell per rank.
    made = [e for e in model["runs"][0]["events"] if e["v"] == "l0_q" and e["k"] == "op"][0]
    node(drv, "e%d" % made["s"]).click()
    check(text(drv, "#value-title") == "l0_q", "value title " + text(drv, "#value-title"))
    rows = drv.find_elements(By.CSS_SELECTOR, "#value-panel table.placements tr")
    check(len(rows) == 3, "l0_q: %d placement rows, expected a header and dp, tp" % len(rows))
    spec = model["runs"][0]["values"]["l0_q"]["spec"]
    shown = [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows[1:]]
    check("[" + ", ".join(shown) + "]" == spec, "l0_q placements shown %s, the trace says %s" % (shown, spec))
    cells = drv.find_elements(By.CSS_SELECTOR, "#value-panel .mesh-svg g.rank")
    check(len(cells) == 4, "l0_q: %d ranks drawn on the 2 x 2 mesh" % len(cells))
    check("block" in cells[0].find_element(By.TAG_NAME, "title").get_attribute("textContent"),
          "rank 0's cell does not say which block it holds")
    check(drv.find_elements(By.CSS_SELECTOR, "#value-panel .tensor-svg"), "l0_q: no picture of its blocks")
    # Step forward: the label moves on and the current op is lit.
    # A value the runtime made for an operand (not in the result's values): its global shape comes
    # from its local shapes, here l0_wq gathered and transposed.
    made_t = [e for e in model["runs"][0]["events"] if e["v"] == "l0_q.weight_t" and e["k"] == "op"][0]
    node(drv, "e%d" % made_t["s"]).click()
    wq = [i for i in json.load(open(os.path.join(SOURCE, "examples/transformer_fsdp_tp_sp.json")))["inputs"] if i["name"] == "l0_wq"][0]
    want = "global shape [%s] (from its local shapes)" % ", ".join(str(n) for n in reversed(wq["shape"]))
    check(want in text(drv, "#value-panel"), "l0_q.weight_t: %r not in %r" % (want, text(drv, "#value-panel")[:300]))
    node(drv, "e%d" % made["s"]).click()
    # Clicking an op's node moves the run to its step; one step on is the next event, forward.
    before = text(drv, "#step-label")
    check("l0_q = matmul" in before, "after clicking l0_q the step is " + before)
    number = int(before.split()[1])
    drv.find_element(By.ID, "next").click()
    after = text(drv, "#step-label")
    check(after.startswith("step %d of" % (number + 1)) and "forward" in after, "after one step: " + after)
    # On to the first collective: its groups on the mesh picture, with the bytes.
    for _ in range(200):
        if "groups of" in text(drv, "#step-detail"):
            break
        drv.find_element(By.ID, "next").click()
    detail = text(drv, "#step-detail")
    check("groups of 2 ranks exchange" in detail, "no collective on the mesh picture: " + detail)
    check(drv.find_elements(By.CSS_SELECTOR, "#graph g.node.current"), "the current op is not lit")
    if shots:
        drv.save_screenshot(os.path.join(shots, "explore_transformer.png"))
    # The communication table sorts by a column on a click.
    first = lambda: [r.text for r in drv.find_elements(By.CSS_SELECTOR, "#comm-table tr")][1]
    drv.find_element(By.CSS_SELECTOR, '#comm-table th[data-k="count"]').click()
    by_count = first()
    drv.find_element(By.CSS_SELECTOR, '#comm-table th[data-k="count"]').click()
    check(first() != by_count, "sorting the communication table by count twice shows the same first row")


def bug(drv, page, trace, shots):
    load(drv, page)
    check(text(drv, "#status") == "fail", "bug: status " + text(drv, "#status"))
    fd = json.load(open(trace))["result"]["first_divergence"]
    mm = fd["mismatch"]["max_abs"]
    shown = text(drv, "#mismatch")
    js = lambda x: str(int(x)) if float(x).is_integer() else repr(float(x))  # as JavaScript prints a number
    for want in ("expected " + js(mm["expected"]), "actual " + js(mm["actual"])):
        check(want in shown, "the mismatch line %r lacks %r" % (shown, want))
    check(text(drv, "#value-title") == fd["value"], "bug: opens at %s, not %s" % (text(drv, "#value-title"), fd["value"]))
    label = text(drv, "#step-label")
    check("forward" in label and fd["value"] in label, "bug: the step it opens at: " + label)
    check(drv.find_elements(By.CSS_SELECTOR, "#value-panel .error"), "bug: the value's failure is not shown")
    if shots:
        drv.save_screenshot(os.path.join(shots, "explore_bug.png"))


def side_by_side(drv, page, shots):
    load(drv, page)
    heading = text(drv, "#diff-panel h3")
    check(heading == "A vs B: 1 values and 1 collectives differ", "side by side: " + heading)
    rows = [r.text for r in drv.find_elements(By.CSS_SELECTOR, "#diff-panel table.diff tr")]
    check("w placement [Rd] vs [R]; gradient [P(sum)] vs [R]" in rows, "side by side: the rows %s" % rows)
    check("backward all_reduce dp 768 B of w 0 1" in rows, "side by side: B's all_reduce of w missing from %s" % rows)
    drv.find_elements(By.CSS_SELECTOR, ".diff-value")[0].click()
    sides = drv.find_elements(By.CSS_SELECTOR, "#value-panel .sbs > div")
    check(len(sides) == 2, "side by side: the value is not shown for A and B")
    check("Rd" in sides[0].text and "Replicate()" in sides[1].text, "side by side: A shows %r, B %r" % (sides[0].text, sides[1].text))
    if shots:
        drv.execute_script("window.scrollTo(0, 0)")
        drv.save_screenshot(os.path.join(shots, "explore_side_by_side.png"))


def refused(drv, page):
    # A scenario the semantics refuse (exit 3) stops before its first event: the page still opens,
    # with the error's kind and message.
    load(drv, page)
    check(text(drv, "#status") == "error", "refused: status " + text(drv, "#status"))
    check("reduced_mismatch: add: operands disagree on Reduced" in text(drv, "#failure"),
          "refused: the error line says " + text(drv, "#failure"))
    check(text(drv, "#step-label").startswith("no steps"), "refused: steps " + text(drv, "#step-label"))


def at_scale(drv, meshsim, src, work):
    # Issue 34's bar: the 1,024-rank transformer's page under 5 MB, loaded in under 2 s; the 8-rank
    # one under 1 MB (docs/gallery.md, "Size and load time").
    for name, ranks, limit in (("scale/transformer_1024", 1024, 5 << 20), ("transformer_fsdp_tp_sp_cp", 8, 1 << 20)):
        page = os.path.join(work, name.replace("/", "_") + ".html")
        explore(meshsim, [os.path.join(src, "examples", name + ".json")], page)
        size = os.path.getsize(page)
        check(size < limit, "%s: %d bytes, over %d" % (name, size, limit))
        seconds = load(drv, page)
        check(seconds < 2.0, "%s (%d ranks): loaded in %.2f s, over 2 s" % (name, ranks, seconds))
        print("%s: %d ranks, %d bytes, loaded in %.2f s" % (name, ranks, size, seconds))


def main():
    args = sys.argv[1:]
    shots = None
    if "--time" in args:
        pages = args[args.index("--time") + 1:]
        drv = browser()
        try:
            for p in pages:
                times = [load(drv, p) for _ in range(3)]
                print("%s: %d bytes, load %.2f s (best of 3: %s)" % (p, os.path.getsize(p), min(times), ", ".join("%.2f" % t for t in times)))
        finally:
            drv.quit()
        return
    if "--screenshots" in args:
        shots = args[args.index("--screenshots") + 1]
        del args[args.index("--screenshots"):args.index("--screenshots") + 2]
    meshsim, src, work = args
    global SOURCE
    SOURCE = src
    os.makedirs(work, exist_ok=True)
    t_page, b_page, d_page = (os.path.join(work, n) for n in ("transformer.html", "bug.html", "side_by_side.html"))
    explore(meshsim, [os.path.join(src, "examples/transformer_fsdp_tp_sp.json")], t_page)
    b_trace = os.path.join(work, "bug.trace.json")
    rc = subprocess.run([meshsim, "run", os.path.join(src, "examples/bugs/partial_bias_in_local_map.json"), "--trace", b_trace],
                        capture_output=True, text=True)
    check(rc.returncode == 0, "the bug's run: exit %d: %s" % (rc.returncode, rc.stderr))
    explore(meshsim, [b_trace], b_page)
    pair = []  # Rd vs R: the same data-parallel step with a Reduced and with a Replicate weight
    for name in ("dp_reduced", "dp_replicated"):
        out = os.path.join(work, name + ".trace.json")
        rc = subprocess.run([meshsim, "run", os.path.join(src, "examples", name + ".json"), "--trace", out],
                            capture_output=True, text=True)
        check(rc.returncode == 0, "%s: exit %d: %s" % (name, rc.returncode, rc.stderr))
        pair.append(out)
    explore(meshsim, pair, d_page)
    r_page = os.path.join(work, "refused.html")
    rc = subprocess.run([meshsim, "explore", os.path.join(src, "examples/reduced_policy_strict.json"), "-o", r_page],
                        capture_output=True, text=True)
    check(os.path.exists(r_page), "reduced_policy_strict: no page (exit %d: %s)" % (rc.returncode, rc.stderr))
    drv = browser()
    try:
        transformer(drv, t_page, shots)
        bug(drv, b_page, b_trace, shots)
        side_by_side(drv, d_page, shots)
        refused(drv, r_page)
        at_scale(drv, meshsim, src, work)
    finally:
        drv.quit()
    print("explore_browser: the transformer, the bug, the side-by-side and the refused pages behave as expected")


if __name__ == "__main__":
    main()
