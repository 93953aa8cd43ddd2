"""The docs hold: links resolve, named files exist, every benchmark table names a real command whose
script prints that table's header, generated tables equal the script's output, and the pages' Python runs.

A table between `<!-- bench: python bench/X.py --flag ... -->` and `<!-- /bench -->` is checked
cheaply: the script exists, `--help` lists each flag, and each header row the script prints (read from
its source: every line of it with two or more quoted labels in f-string fields, such as
`f"{'method':<44}" + "".join(f"{'eps=' + str(e):>22}" ...)`) appears in the table. A table between
`<!-- generated: python bench/X.py -->` and `<!-- /generated -->` is rerun and compared line by line
(only for cheap, deterministic scripts). The `test_checker_*` tests show that each check can fail.

Numbers in prose agree with the tables (`check_quoted_numbers`): in a docs page, in each section (a
heading to the next heading) that holds a marked table, and in each paragraph elsewhere that speaks of a
table (the word, or a link to such a section), every number a prose sentence quotes (a decimal
such as 4.71, or an integer of 3 or more digits such as 820 or 63,401; thousands separators and trailing
zeros ignored) must be printed in one of the page's marked tables. Not quotes, and not checked: inline
code, link targets, HTML comments, powers (2^10, 10^6, 2^-128), assignments and comparisons (n = 5,000,
N = 1024, b=16, p < 0.05), eps/epsilon/rho/delta followed by a value (eps 0.5), references and versions
(RFC 9180, Theorem 3.1, section 4.2, Algorithm 2, issue 21, HTTP 429, Python 3.11), goals and defaults (goal 1.7x, default 1000), sizes in a compound
(128-bit, 16-byte), and a year after a name (Canonne, Kamath, Steinke 2020; ICML 2023). A sentence
that quotes numbers measured elsewhere says so with the words "not from a table" and is skipped.
"""
from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
MARKED = re.compile(r"<!-- (bench|generated): (.*?) -->[ \t]*\n(.*?)<!-- /\1 -->", re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w./-])((?:fss|dpcdf|bench|examples|tests|docs)/[\w./-]*[\w/])")
LABEL = re.compile(r"""\{\s*(['"])(.*?)\1\s*(\+[^:}]*)?:[^}]*\}""")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    prose = FENCE.sub("", text)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", prose, re.M)}


def check_links(text: str, where: Path) -> list[str]:
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (where.parent / path).resolve() if path else where
        if not dest.exists() or ROOT not in (dest, *dest.parents):
            problems.append(f"{where.name}: link {target} does not resolve to a file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            problems.append(f"{where.name}: link {target}: no heading #{anchor} in {dest.name}")
    return problems


def check_paths(text: str, where: Path) -> list[str]:
    """Every repository path the page names (`dpcdf/release/noise.py`, `python bench/x.py`) exists."""
    return [f"{where.name}: names {p}, which does not exist"
            for p in sorted(set(PATH.findall(text))) if not (ROOT / p).exists()]


def header_templates(source: str) -> list[re.Pattern]:
    """One pattern per source line that formats a header: two or more quoted labels in f-string fields.
    A label with `+ str(...)` (like 'eps=' + str(e)) takes a value and may repeat."""
    out = []
    for line in source.splitlines():
        labels = [(lab, bool(plus)) for _, lab, plus in LABEL.findall(line) if lab]
        if len(labels) < 2:
            continue
        parts = [re.escape(lab) + (rf"[^\s|]+(?:[\s|]+{re.escape(lab)}[^\s|]+)*" if plus else "")
                 for lab, plus in labels]
        out.append(re.compile(r"[\s|]+".join(parts)))
    return out


@functools.lru_cache(maxsize=None)
def script_help(script: str) -> str:
    run = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{script} --help failed:\n{run.stderr[-2000:]}"
    return run.stdout


@functools.lru_cache(maxsize=None)
def script_output(argv: tuple[str, ...]) -> str:
    run = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{' '.join(argv)} failed:\n{run.stderr[-2000:]}"
    return run.stdout


def marked_tables(text: str) -> list[tuple[str, str, str]]:
    """(kind, command, table) for each marked region; a region holds exactly one fenced block."""
    out = []
    for kind, command, region in MARKED.findall(text):
        blocks = FENCE.findall(region)
        out.append((kind, command, blocks[0][1] if len(blocks) == 1 and not FENCE.sub("", region).strip() else None))
    return out


def check_tables(text: str, where: Path) -> list[str]:
    problems = []
    if text.count("<!-- bench:") + text.count("<!-- generated:") != len(MARKED.findall(text)):
        problems.append(f"{where.name}: a bench marker is not closed by its <!-- /bench --> or <!-- /generated -->")
    for kind, command, table in marked_tables(text):
        argv = shlex.split(command)
        if table is None:
            problems.append(f"{where.name}: [{command}] must hold exactly one fenced block and nothing else")
            continue
        if len(argv) < 2 or argv[0] != "python" or not re.fullmatch(r"bench/[\w-]+\.py", argv[1]):
            problems.append(f"{where.name}: [{command}] is not `python bench/SCRIPT.py [flags]`")
            continue
        script = ROOT / argv[1]
        if not script.is_file():
            problems.append(f"{where.name}: [{command}] names {argv[1]}, which does not exist")
            continue
        flags = [a.split("=")[0] for a in argv[2:] if a.startswith("--")]
        if flags:
            usage = script_help(argv[1])
            problems += [f"{where.name}: [{command}]: {argv[1]} --help does not list {f}"
                         for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", usage)]
        templates = header_templates(script.read_text())
        if not templates:
            problems.append(f"{where.name}: [{command}]: found no header in {argv[1]}")
        lines = [line.strip() for line in table.splitlines()]
        for t in templates:
            if not any(t.fullmatch(line) for line in lines):
                problems.append(f"{where.name}: [{command}]: the table has no row matching the header {argv[1]} prints: {t.pattern}")
        if kind == "generated":
            want = [line.rstrip() for line in script_output(tuple(argv[1:])).rstrip("\n").splitlines()]
            have = [line.rstrip() for line in table.rstrip("\n").splitlines()]
            if want != have:
                problems.append(f"{where.name}: [{command}]: the table differs from the script's output")
    return problems


def check_unmarked_tables(text: str, where: Path) -> list[str]:
    """A plain fenced block outside the markers must not be a benchmark table."""
    templates = [t for s in sorted((ROOT / "bench").glob("*.py")) for t in header_templates(s.read_text())]
    outside = MARKED.sub("", text)
    return [f"{where.name}: a benchmark table outside bench markers (header {t.pattern})"
            for info, body in FENCE.findall(outside) if info.strip() in ("", "text")
            for t in templates if any(t.fullmatch(line.strip()) for line in body.splitlines())]


QUOTED = re.compile(r"(?<![\w.^,])(?<![A-Za-z]-)(?<!\^-)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d{3,})"
                    r"(?![\d^]|\.\d|,\d{3}|-[A-Za-z]|[A-Za-wyz_])")  # 4.71, 820, 63,401, 2.1x; not 2^10, AES-128
TABLE_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
NOT_FROM_TABLE = "not from a table"
NOT_QUOTES = [
    re.compile(r"`[^`\n]*`"),  # inline code: commands, flags, names
    re.compile(r"<!--.*?-->", re.S),
    re.compile(r"\]\([^)\s]*\)|https?://\S+"),  # link targets, URLs
    re.compile(r"[\w.()+-]*\^\(?-?[\w.]+\)?"),  # powers: 2^10, 10^6, 2^-128
    re.compile(r"(?i)\b(?:eps(?:ilon)?|rho|delta)\b\s*(?:[=<>]=?|≤|≥)?\s*\d[\d,.]*"),  # eps 0.5, rho=0.125
    re.compile(r"\b[A-Za-z]\w*\s*(?:[=<>]=?|≤|≥)\s*\d[\d,.]*"),  # n = 5,000, N = 1024, b=16, p < 0.05
    re.compile(r"\b(?:RFC|Theorem|Lemma|[Ss]ection|Algorithm|Fig\.|Figure|eq\.|[Ii]ssue|Definition|Corollary|"
               r"Proposition|Appendix|HTTP|[Ss]tatus|Python|numba|numpy|version|v|[Gg]oals?(?: of)?|[Dd]efault)\s*\d[\d.]*"),
    re.compile(r"\b[A-Z][A-Za-z]+(?:,? et al\.)?,? (?:19[5-9]\d|20[0-2]\d)\b"),  # a citation's year
]


def prose_sections(text: str) -> tuple[list[tuple[str, str, int]], list[str]]:
    """(heading, prose, marked tables in it) per section, and every marked table of the page. Prose
    is the section without its fenced blocks and marked regions."""
    tables: list[str] = []

    def keep(m: re.Match) -> str:
        tables.append(m.group(3))
        return "\x00"

    body = FENCE.sub("", MARKED.sub(keep, text))
    out = []
    for part in re.split(r"(?m)^(?=#{1,6} )", body):
        heading = part.splitlines()[0] if part.startswith("#") else ""
        prose = part[len(heading):]
        out.append((heading, prose.replace("\x00", ""), prose.count("\x00")))
    return out, tables


def normal(number: str) -> str:
    """1,030 -> 1030; 1.20 -> 1.2; 3.0 -> 3."""
    n = number.replace(",", "")
    return n.rstrip("0").rstrip(".") if "." in n else n


def quoted_numbers(prose: str) -> list[tuple[str, str]]:
    """(number, sentence) for each number the prose quotes (see the module's docstring)."""
    out = []
    for paragraph in re.split(r"\n\s*\n", prose):
        flat = " ".join(line for line in paragraph.split("\n") if not line.lstrip().startswith("|---"))
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*|-])", " ".join(flat.split())):
            if NOT_FROM_TABLE in sentence:
                continue
            plain = sentence
            for pattern in NOT_QUOTES:
                plain = pattern.sub(" ", plain)
            out += [(m, sentence) for m in QUOTED.findall(plain)]
    return out


def check_quoted_numbers(text: str, where: Path) -> list[str]:
    """Each number quoted in a section that holds a marked table is printed in one of the page's marked tables."""
    sections, tables = prose_sections(text)
    printed = {normal(x) for t in tables for x in TABLE_NUMBER.findall(t)}
    with_tables = {slug(heading.lstrip("#")) for heading, _, marked in sections if marked and heading}
    refers = re.compile(r"\btables?\b|\]\(#(?:" + "|".join(map(re.escape, with_tables)) + r")\)" if with_tables else r"\btables?\b")
    checked = []
    for heading, prose, marked in sections:
        paragraphs = [prose] if marked else [p for p in re.split(r"\n\s*\n", prose) if tables and refers.search(p)]
        checked += [(heading, n, sentence) for p in paragraphs for n, sentence in quoted_numbers(p)]
    return [f"{where.name}, {heading.strip() or 'top'}: {number} is in none of the page's tables (or say "
            f"'{NOT_FROM_TABLE}'): {sentence[:160]}"
            for heading, number, sentence in checked if normal(number) not in printed]


def python_blocks(text: str) -> list[str]:
    """Blocks fenced as exactly ```python (```python no-run and other fences are not run)."""
    return [body for info, body in FENCE.findall(text) if info.strip() == "python"]


# --- the docs as they are -------------------------------------------------------------------------

def test_readme_links_every_docs_page_and_each_exists():
    text = README.read_text()
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(text)
              if t.startswith("docs/") and t.partition("#")[0].endswith(".md")}
    assert {"fss.md", "accuracy.md", "applications.md", "service.md"} <= {p.name for p in linked}
    assert all(p.is_file() for p in linked), [str(p) for p in linked if not p.is_file()]
    assert set(DOCS) <= linked, f"docs pages not linked from the README: {sorted(set(DOCS) - linked)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_named_paths_resolve(page):
    text = page.read_text()
    assert check_links(text, page) + check_paths(text, page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_benchmark_tables_name_real_commands_and_headers(page):
    text = page.read_text()
    assert check_tables(text, page) + check_unmarked_tables(text, page) == []


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_numbers_in_prose_are_in_the_pages_tables(page):
    assert check_quoted_numbers(page.read_text(), page) == []


@pytest.mark.parametrize("name", ["fss.md", "accuracy.md", "applications.md", "service.md"])
def test_pages_with_numbers_have_their_marked_table(name):
    scripts = {shlex.split(c)[1] for _, c, _ in marked_tables((ROOT / "docs" / name).read_text())}
    expected = {"fss.md": {"bench/bench_fss.py", "bench/key_sizes.py"}, "accuracy.md": {"bench/bench_accuracy.py"},
                "applications.md": {"bench/bench_apps.py"}, "service.md": {"bench/bench_server.py"}}[name]
    assert expected <= scripts


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_docs_python_blocks_run(page):
    for block in python_blocks(page.read_text()):
        exec(compile(block, str(page), "exec"), {})


def test_readme_headline_numbers_come_from_the_docs_tables():
    readme = README.read_text()
    section = re.search(r"^## Performance\n(.*?)(?=^## )", readme, re.M | re.S).group(1)
    tables = "\n".join(t for p in DOCS for _, _, t in marked_tables(p.read_text()) if t)
    numbers = set(re.findall(r"(?<![\w.])\d+\.\d+|(?<![\w.])\d{3,}", section))
    assert len(numbers) >= 10
    missing = [n for n in sorted(numbers) if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", tables)]
    assert missing == [], f"README numbers not in any docs benchmark table: {missing}"


def test_readme_stays_short_and_starts_with_the_two_commands():
    text = README.read_text()
    assert len(text.encode()) < 8500
    commands = re.findall(r"^    (\S.*)$", text, re.M)
    assert commands[:2] == [
        "python3 -m venv .venv && .venv/bin/pip install -e '.[demo]' && .venv/bin/dpcdf demo",
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -q -n 2 --dist loadscope",
    ]
    # CI runs exactly the README's test command (quietly installing)
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1].replace("pip install -e", "pip install -q -e") in ci
    assert text.index(commands[1]) < text.index("```")
    assert re.search(r"^## Architecture$", text, re.M) and "tests/test_layout.py" in text


# --- the checks can fail ----------------------------------------------------------------------------

APPS = ROOT / "docs" / "applications.md"


def test_checker_catches_a_renamed_script():
    text = APPS.read_text().replace("bench/bench_apps.py --runs 100 -->", "bench/bench_applications.py --runs 100 -->")
    assert any("does not exist" in p for p in check_tables(text, APPS))


def test_checker_catches_an_unknown_flag():
    text = APPS.read_text().replace("bench/bench_apps.py --runs 100 -->", "bench/bench_apps.py --rounds 100 -->")
    assert any("does not list --rounds" in p for p in check_tables(text, APPS))


def test_checker_catches_a_header_the_script_does_not_print():
    text = APPS.read_text().replace("\ndata      ", "\ndataset   ", 1)
    assert any("no row matching the header" in p for p in check_tables(text, APPS))


def test_checker_catches_a_table_from_another_script():
    text = APPS.read_text().replace("bench/bench_apps.py --runs 100 -->", "bench/bench_server.py -->")
    assert any("no row matching the header" in p for p in check_tables(text, APPS))


def test_checker_catches_an_unmarked_table_and_an_unclosed_marker():
    text = APPS.read_text()
    assert check_unmarked_tables(text.replace("<!-- /bench -->", ""), APPS)
    assert check_unmarked_tables(MARKED.sub(lambda m: m.group(3), text), APPS)
    assert check_tables(text.replace("<!-- /bench -->", ""), APPS)


def test_checker_catches_a_generated_table_that_went_stale():
    fss = ROOT / "docs" / "fss.md"
    text = fss.read_text().replace("   808     800.0", "   816     800.0", 1)
    assert any("differs from the script's output" in p for p in check_tables(text, fss))


def test_checker_catches_broken_links_anchors_and_paths():
    assert check_links("[x](docs/nope.md)", README)
    assert check_links("[x](docs/fss.md#no-such-heading)", README)
    assert not check_links("[x](docs/fss.md#benchmark) [y](https://example.org/z)", README)
    assert check_paths("see `dpcdf/noise.py`", README)
    assert not check_paths("see `dpcdf/release/noise.py`", README)


def test_checker_runs_only_plain_python_fences():
    text = "```python\nx = 1\n```\n```python no-run\nserver()\n```\n```sh\nls\n```\n"
    assert python_blocks(text) == ["x = 1\n"]


def test_checker_catches_a_number_the_table_does_not_print():
    text = APPS.read_text()
    section = text[text.index("## Benchmark"):]
    number = next(n for n in TABLE_NUMBER.findall(marked_tables(section)[0][2]) if "." in n and len(n) >= 4)
    assert check_quoted_numbers(text, APPS) == []
    wrong = text.replace("<!-- /bench -->", f"<!-- /bench -->\n\nThe table shows {number}5 here.\n", 1)
    assert any(f"{number}5 is in none of the page's tables" in p for p in check_quoted_numbers(wrong, APPS))
    right = text.replace("<!-- /bench -->", f"<!-- /bench -->\n\nThe table shows {number} here.\n", 1)
    assert check_quoted_numbers(right, APPS) == []
    marked = wrong.replace(f"{number}5 here.", f"{number}5 here (another run, not from a table).")
    assert check_quoted_numbers(marked, APPS) == []


def test_checker_reads_numbers_as_quotes_or_parameters():
    table = "<!-- bench: python bench/bench_apps.py -->\n```\nx  4.71  50.06  1,030  708  567\n```\n<!-- /bench -->\n"
    page = ROOT / "docs" / "x.md"

    def missing(prose: str) -> list[str]:
        return [p.split(":")[1].split(" is in")[0].strip() for p in check_quoted_numbers(f"## A\n{table}\n{prose}\n", page)]

    assert missing("The close took 4.71 s and the query 50.06 s; 1030 reports/s; 708 against 567.") == []
    assert missing("The close took 4.7 s, 13.6 s and 820 against 414 (1,031 reports/s).") == ["4.7", "13.6", "820", "414", "1,031"]
    assert missing("At n = 5,000 and N = 1024 on 2^10 points, 10^6 reports, eps 0.5, rho=0.125, p < 0.05.") == []
    assert missing("RFC 9180, Theorem 3.1, section 4.2, issue 21, HTTP 429, Python 3.11, 128-bit keys, `--runs 400`.") == []
    assert missing("A goal of 1.7x (goal 100,000 reports/s), --batch default 1000, and <!-- 999 --> [x](#a-123).") == []
    assert missing("(Canonne, Kamath, Steinke 2020; Boyle et al. 2021; ICML 2023); but 2000 reports.") == ["2000"]
    assert missing("Ranges 7.05-9.64 and 3.2x faster; 12 runs of 40.") == ["7.05", "9.64", "3.2"]
    assert check_quoted_numbers(f"## A\nSee 820 here.\n## B\n{table}", page) == []  # a section without a table
    assert check_quoted_numbers(f"## A\nSee 820 in the [table](#b).\n## B\n{table}", page)  # ... that points to one
    assert check_quoted_numbers(f"## A\nThe table says 820.\n## B\n{table}", page)
