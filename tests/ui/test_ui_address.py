"""The report links to the port the UI runs on: ``attnstudy ui --port 5055`` records the address
beside the SQLite store, and a report built from that store links there (it linked to port 5000
whatever port the UI ran on)."""

from __future__ import annotations

from attnstudy.report.context import DEFAULT_UI_URL, ui_base_url
from attnstudy.serving import ui


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
    from attnstudy.cli import main as cli
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


def test_a_users_file_named_ui_address_is_never_replaced(tmp_path):
    """``record_address`` replaced any file named ``ui-address`` beside the store: a user's notes
    of that name were lost. Only its own record (one address line) is replaced; a user's file, a
    symbolic link (and the file it points to) are left byte for byte, and no record is kept."""
    db = tmp_path / "mlflow.db"
    target = tmp_path / ui.UI_ADDRESS_FILE
    ui.record_address(db, "http://127.0.0.1:5055")
    ui.record_address(db, "http://127.0.0.1:6066")  # its own earlier record: replaced
    assert target.read_text() == "http://127.0.0.1:6066\n"

    notes = b"my notes\nhttp://127.0.0.1:5055\n"
    target.write_bytes(notes)
    ui.record_address(db, "http://127.0.0.1:7077")
    assert target.read_bytes() == notes
    assert ui.recorded_address(db) is None

    target.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "address.txt").write_text("http://127.0.0.1:5055\n")
    target.symlink_to(elsewhere / "address.txt")
    ui.record_address(db, "http://127.0.0.1:7077")
    assert target.is_symlink()
    assert (elsewhere / "address.txt").read_text() == "http://127.0.0.1:5055\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", ui.UI_ADDRESS_FILE]
