"""The report links to the port the UI runs on: ``attnstudy ui --port 5055`` records the address
beside the SQLite store, and a report built from that store links there (it linked to port 5000
whatever port the UI ran on)."""

from __future__ import annotations

from attnstudy import ui
from attnstudy.report.context import DEFAULT_UI_URL, ui_base_url


def test_the_recorded_address_is_read_back_and_a_bad_one_ignored(tmp_path):
    db = tmp_path / "mlflow.db"
    assert ui.recorded_address(db) is None
    ui.record_address(db, "http://127.0.0.1:5055")
    assert (tmp_path / ui.UI_ADDRESS_FILE).read_text() == "http://127.0.0.1:5055\n"
    assert ui.recorded_address(db) == "http://127.0.0.1:5055"
    for bad in ("", "127.0.0.1:5055", "http://h:1/x", "javascript:alert(1)", "http://a b:1"):
        (tmp_path / ui.UI_ADDRESS_FILE).write_text(bad + "\n")
        assert ui.recorded_address(db) is None, bad
    assert sorted(p.name for p in tmp_path.iterdir()) == [ui.UI_ADDRESS_FILE]  # no temporary


def test_the_report_links_to_the_recorded_port_unless_told_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNSTUDY_UI_URL", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert ui_base_url(None, uri) == DEFAULT_UI_URL
    ui.record_address(tmp_path / "mlflow.db", "http://127.0.0.1:5055")
    assert ui_base_url(None, uri) == "http://127.0.0.1:5055"
    assert ui_base_url("http://ui.example:8080/", uri) == "http://ui.example:8080"
    assert ui_base_url(None, "http://tracking.example:5000") == "http://tracking.example:5000"
    monkeypatch.setenv("ATTNSTUDY_UI_URL", "http://env.example:9000")
    assert ui_base_url(None, uri) == "http://env.example:9000"


def test_attnstudy_ui_records_the_address_it_serves(fresh_root, monkeypatch, capsys):
    from attnstudy import cli
    from attnstudy.tracking import Tracker

    Tracker().experiment_id("uitest")  # the store
    monkeypatch.setattr(ui, "start_server", lambda *args, **kwargs: object())
    monkeypatch.setattr(ui, "wait_healthy", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    monkeypatch.setattr(ui, "stop_server", lambda proc: None)
    port = ui.free_port()
    assert cli.main(["ui", "--port", str(port), "--experiment", "uitest"]) == 0
    store = fresh_root / "mlruns"
    assert (store / ui.UI_ADDRESS_FILE).read_text() == f"http://127.0.0.1:{port}\n"
    assert ui_base_url(None, f"sqlite:///{store / 'mlflow.db'}") == f"http://127.0.0.1:{port}"
