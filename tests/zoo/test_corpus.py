"""The corpus: which files count, and a hold-out split that depends on nothing but each file's path."""

from tandem.zoo.corpus import is_heldout, list_source_files, load_corpus, stdlib_root


def _write(root, relative, text="x = 1\n"):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text) if isinstance(text, str) else path.write_bytes(text)


def test_lists_sorted_python_files_without_tests_packages_and_generated_tables(tmp_path):
    for name in ("b.py", "a.py", "pkg/z.py", "pkg/__init__.py", "notes.txt"):
        _write(tmp_path, name)
    for name in ("test/test_a.py", "pkg/tests/t.py", "idlelib/idle_test/t.py", "site-packages/x/y.py"):
        _write(tmp_path, name)
    _write(tmp_path, "__pycache__/a.py")
    _write(tmp_path, "config-3.11-x86_64-linux-gnu/python-config.py")
    _write(tmp_path, "_sysconfigdata__linux.py")
    _write(tmp_path, "encodings/cp1252.py", '""" Python Character Mapping Codec cp1252 generated from X\n')
    _write(tmp_path, "latin.py", "s = 'caf\xe9'\n".encode("latin-1"))  # not UTF-8
    _write(tmp_path, "empty.py", "\n")
    assert [f.path for f in list_source_files(tmp_path)] == ["a.py", "b.py", "pkg/__init__.py", "pkg/z.py"]


def test_heldout_membership_is_a_fixed_function_of_the_path():
    names = [f"pkg{i // 50}/module_{i}.py" for i in range(20_000)]
    held = [n for n in names if is_heldout(n, 0.02)]
    assert 0.015 < len(held) / len(names) < 0.025
    assert held == [n for n in names if is_heldout(n, 0.02)]
    assert all(is_heldout(n, 0.05) for n in held)  # a larger fraction only adds files


def test_split_ignores_other_files_and_hashes_identify_it(tmp_path):
    for i in range(60):
        _write(tmp_path, f"m{i:02d}.py", f"value = {i}\n")
    first = load_corpus(tmp_path, heldout_fraction=0.1)
    assert first.heldout and first.train
    assert not {f.path for f in first.heldout} & {f.path for f in first.train}
    _write(tmp_path, "extra.py", "y = 2\n")
    second = load_corpus(tmp_path, heldout_fraction=0.1)
    assert [p for p in second.heldout_paths if p != "extra.py"] == first.heldout_paths
    assert load_corpus(tmp_path, 0.1).content_sha256 == second.content_sha256 != first.content_sha256
    assert len(first.heldout_list_sha256) == 64


def test_tiny_corpus_still_holds_out_one_file(tmp_path):
    for name in ("a.py", "b.py", "c.py"):
        _write(tmp_path, name)
    corpus = load_corpus(tmp_path, heldout_fraction=0.0)
    assert len(corpus.heldout) == 1 and len(corpus.train) == 2


def test_stdlib_corpus_holds_out_about_two_percent_of_files():
    corpus = load_corpus()
    assert corpus.root == stdlib_root()
    total = len(corpus.train) + len(corpus.heldout)
    assert total > 500 and 0.01 < len(corpus.heldout) / total < 0.03
    assert not any("/test/" in f"/{f.path}" or "site-packages" in f.path for f in corpus.train)
    assert any(f.path == "functools.py" for f in corpus.train + corpus.heldout)
