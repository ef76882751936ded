"""``pcache status``: workers, capacity, load and replication health."""

from __future__ import annotations

import json

import click
from google.protobuf.json_format import MessageToDict

from pcache.cli.common import resolve_master
from pcache.common.cli import EXIT_OK, EXIT_PARTIAL
from pcache.common.config import ClientConfig
from pcache.common.errors import PCacheError, Unavailable


@click.command(epilog="Example: pcache status --json")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> int:
    """Show the cluster's workers and block health; exit 1 if any block is missing or corrupt
    (not while a restarted master still waits for the workers' block reports)."""
    from pcache.client import Client

    master = resolve_master(ctx)
    many = "," in master
    # one address that is a follower: the leader it names answers (a health check pointed at one
    # master of a pair alerted, exit 2, whenever that master was the follower)
    with Client(ClientConfig(master=master, failover_timeout=5.0)) as pc:
        try:
            st = pc.status()
        except Unavailable:
            if not many:
                raise
            # no master leads: say what each one is doing, then fail as an unreachable master does
            for address, own in pc.master_statuses():
                if isinstance(own, PCacheError):
                    click.echo(f"master {address}: {own}")
                else:
                    leader = own.master.leader or (
                        f"none: etcd not answering for {own.master.etcd_down:.0f} s (down, unreachable or no quorum)" if own.master.etcd_down
                        else f"none; this master may not take over: {own.master.may_not_lead}"
                        if own.master.may_not_lead else "none (an election is under way)"
                    )  # fmt: skip
                    click.echo(f"master {address}: {own.master.role}, epoch {own.epoch}, log index"
                               f" {own.master.applied_index}, leader {leader}")  # fmt: skip
            raise
    if as_json:
        click.echo(
            json.dumps(
                MessageToDict(st, preserving_proto_field_name=True, always_print_fields_with_no_presence=True), indent=2
            )
        )
    else:
        _echo_masters(st.master)
        alive = sum(1 for w in st.workers if w.alive)
        if st.starting_left > 0:  # the workers that have not registered yet are not known here
            click.echo(f"epoch {st.epoch}  workers {alive} registered so far  inodes {st.inodes}  blocks {st.blocks}")
            click.echo(
                f"under-replicated {st.under_replicated_blocks}  not reported yet {st.missing_blocks}"
                f"  corrupt {st.corrupt_blocks}  damaged files: known once the workers have reported"
            )
        else:
            click.echo(
                f"epoch {st.epoch}  workers {alive}/{len(st.workers)} alive  inodes {st.inodes}  blocks {st.blocks}"
            )
            click.echo(
                f"under-replicated {st.under_replicated_blocks}  missing {st.missing_blocks}  corrupt {st.corrupt_blocks}"
                f"  damaged files {st.damaged_files}" + ("  (pcache fsck names them)" if st.damaged_files else "")
            )
        if st.starting_left > 0:
            click.echo(
                f"STARTING: the master waits {st.starting_left:.1f} s more for workers to report their blocks;"
                " until then blocks not reported yet count as missing and nothing is repaired"
            )
        if st.blocks_without_target:
            click.echo(
                f"  {st.blocks_without_target} under-replicated blocks wait for a target: no other live worker"
                " has room for them, or copies to those that do failed lately (see below)"
            )
        if st.cached_bound_blocks or st.evicted_blocks:
            click.echo(
                f"bound files: {st.cached_bound_blocks} blocks cached, {st.evicted_blocks} evicted"
                f" ({st.evicted_bytes} bytes) since this master leads"
            )
        click.echo(
            f"{'worker':<14} {'address':<22} {'node':<16} {'state':<6} {'used':>12} {'free':>14} {'inflight':>8} {'tier hit':>8}"
        )
        for w in st.workers:
            info = w.info
            state = "alive" if w.alive else "DEAD"
            # a dead worker's last heartbeat: its disk usage stands, its live figures do not
            inflight, hit = (f"{info.inflight}", f"{info.mem_tier_hit_ratio:.2f}") if w.alive else ("-", "-")
            click.echo(
                f"{info.addr.worker_id:<14} {info.addr.host + ':' + str(info.addr.port):<22} {info.addr.node_id[:16]:<16} "
                f"{state:<6} {info.used_bytes:>12} {info.free_bytes:>14} {inflight:>8} {hit:>8}"
            )
            if w.failed_copies:
                click.echo(
                    f"  ! {w.failed_copies} copies to {info.addr.worker_id} failed lately, the last with"
                    f" {w.failed_copy_error or 'no error given'}: it gets copies only when no other worker can take them"
                )
        if st.tenants:
            from pcache.cli.tenant import echo_tenants

            echo_tenants(list(st.tenants))
    if st.starting_left > 0:
        return EXIT_OK  # not every worker has reported yet: missing is not known
    return EXIT_PARTIAL if st.missing_blocks or st.corrupt_blocks else EXIT_OK


def _echo_masters(role) -> None:
    """The leader and its followers: role, member, epoch's log position, sync state and lag."""
    if role.role == "standalone" or not role.role:
        click.echo(f"master {role.address} (standalone, log index {role.applied_index})")
        return
    click.echo(f"leader {role.address} (member {role.member}, log index {role.applied_index})")
    if role.alone:
        click.echo(
            "  ALONE: no in-sync follower; acknowledged changes live on the leader only, and a failover"
            " must wait for it"
        )
    for f in role.followers:
        sync = "in sync" if f.in_sync else "OUT OF SYNC"
        age = f"{f.last_contact_age:.1f} s ago" if f.last_contact_age >= 0 else "never"
        if f.state == "gone":
            click.echo(
                f"  follower {f.address} (member {f.member}): GONE {f.gone_age:.0f} s ago (its etcd member key"
                f" expired: dead, stopped or cut off), last answer {age}; not replicated to until it is back"
            )
            continue
        if f.last_contact_age < 0 and not f.in_sync:  # (re)joined, or never reached: its position is not known
            click.echo(
                f"  follower {f.address} (member {f.member}): OUT OF SYNC, {f.state}, not answered yet"
                " (its log position is not known)"
            )
            continue
        click.echo(
            f"  follower {f.address} (member {f.member}): {sync}, {f.state}, lag {f.lag} entries, "
            f"applied {f.applied_index}, last answer {age}"
        )


COMMANDS = [status]
