"""`qm list` and `pct list` rows read by their values, not cut at the header's offsets.

qm list prints "%10s %-20s %-10s %-10s %12s %-10s" (PVE/CLI/qm.pm), so a VM name over 20
characters (PVE allows 63) pushes status, memory, boot disk and pid to the right; pct list prints
"%-10s %-10s %-12s %-20s" (PVE/CLI/pct.pm), and the lock `snapshot-delete` (15 characters) pushes
the name. Both are made here exactly as the nodes print them (the simulator does the same)."""

from __future__ import annotations

from gateway.tools.runtimes.ssh import parse_output

QM = "%10s %-20s %-10s %-10s %12s %-10s"
QM_ROW = "%10s %-20s %-10s %-10s %12.2f %-10s"
PCT = "%-10s %-10s %-12s %-20s"


def qm_list(*rows: tuple[int, str, str, int, float, int]) -> str:
    lines = [QM % ("VMID", "NAME", "STATUS", "MEM(MB)", "BOOTDISK(GB)", "PID")] + [QM_ROW % r for r in rows]
    return "\n".join(lines) + "\n"


def pct_list(*rows: tuple[int, str, str, str]) -> str:
    lines = [PCT % ("VMID", "Status", "Lock", "Name")] + [PCT % r for r in rows]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def test_qm_list_long_name() -> None:
    # the reviewer's case: name "build-runner-ubuntu-2", status "404-large s", memory "topped    5"
    text = qm_list(
        (102, "win-build", "stopped", 8192, 80, 0),
        (710, "build-runner-ubuntu-2404-large", "stopped", 512, 12, 0),
        (711, "x" * 63, "running", 2048, 32, 4242),
    )
    assert parse_output("table", text, 0) == [
        {
            "vmid": "102",
            "name": "win-build",
            "status": "stopped",
            "mem(mb)": "8192",
            "bootdisk(gb)": "80.00",
            "pid": "0",
        },
        {
            "vmid": "710",
            "name": "build-runner-ubuntu-2404-large",
            "status": "stopped",
            "mem(mb)": "512",
            "bootdisk(gb)": "12.00",
            "pid": "0",
        },
        {
            "vmid": "711",
            "name": "x" * 63,
            "status": "running",
            "mem(mb)": "2048",
            "bootdisk(gb)": "32.00",
            "pid": "4242",
        },
    ]


def test_qm_list_without_name() -> None:
    rows = parse_output("table", qm_list((103, "", "running", 1024, 16, 10721)), 0)
    assert rows == [
        {"vmid": "103", "name": "", "status": "running", "mem(mb)": "1024", "bootdisk(gb)": "16.00", "pid": "10721"}
    ]


def test_pct_list_long_lock_and_empty_lock() -> None:
    text = pct_list(
        (200, "running", "", "app-host"),
        (201, "stopped", "snapshot-delete", "db"),
        (202, "stopped", "backup", "a-container-name-longer-than-twenty"),
        (203, "stopped", "migrate", ""),
    )
    assert parse_output("table", text, 0) == [
        {"vmid": "200", "status": "running", "lock": "", "name": "app-host"},
        {"vmid": "201", "status": "stopped", "lock": "snapshot-delete", "name": "db"},
        {"vmid": "202", "status": "stopped", "lock": "backup", "name": "a-container-name-longer-than-twenty"},
        {"vmid": "203", "status": "stopped", "lock": "migrate", "name": ""},
    ]


def test_other_tables_keep_header_offsets() -> None:
    assert parse_output("table", "VMID NAME\n100  a\u0085b\n", 0) == [{"vmid": "100", "name": "a\u0085b"}]
