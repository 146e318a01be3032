"""`athanor traffic plot` without matplotlib: a one-line error naming the `plot` extra."""

import sys

from athanor.cli import main


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1]}\n'
                     '{"timestamp": 1000, "input_length": 20, "output_length": 7, "hash_ids": [2]}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails as if not installed
    assert main(["traffic", "plot", str(trace), "-o", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "pip install 'athanor[plot]'" in err
    assert not (tmp_path / "p.png").exists()
