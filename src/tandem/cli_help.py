"""`tandem serve --help` in groups: the model, the engine, the HTTP server, the gateway.

One flat list of 45 flags mixed one replica's with the gateway's. The flags keep their definitions
(tandem.serve.options, tandem.edge.options, tandem.gateway.options); this only says, by name, under
which heading each is listed. A flag no group names is listed under "Other options", so a new flag
is never hidden.
"""

from __future__ import annotations

import click

__all__ = ["SERVE_GROUPS", "GroupedOptionsCommand"]

SERVE_GROUPS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "Model",
        frozenset(
            {"model", "recipe", "served_model_name", "dtype", "generation_config", "tool_call_parser", "max_model_len"}
        ),
    ),
    (
        "Engine",
        frozenset({"threads", "kv_cache_tokens", "max_num_seqs", "max_prefill_tokens", "enable_prefix_caching"}),
    ),
    (
        "Server",
        frozenset(
            {
                "host",
                "port",
                "api_key",
                "config_file",
                "max_queue",
                "max_body_bytes",
                "max_n",
                "max_request_share",
                "retry_after_s",
                "shutdown_timeout",
                "log_level",
                "access_log",
                "metrics_prefix",
                "max_connections",
                "header_timeout",
                "body_timeout",
                "keep_alive_timeout",
                "max_header_bytes",
                "backlog",
            }
        ),  # fmt: skip
    ),
    (
        "Gateway (any of these makes `tandem serve` a gateway over replicas)",
        frozenset(
            {
                "deployment",
                "replicas_min",
                "replicas_max",
                "policy",
                "fallback",
                "regions",
                "log_dir",
                "replica_ports",
                "queue_timeout",
                "backend",
                "ray_address",
                "first_byte_timeout",
                "stream_idle_timeout",
                "max_resumes",
                "shadow",
                "shadow_fraction",
                "tenants",
                "usage_db",
                "node_memory_gb",
                "print_deployment_schema",
            }
        ),  # fmt: skip
    ),
)


class GroupedOptionsCommand(click.Command):
    """A click command whose --help lists its options under SERVE_GROUPS' headings, in that order."""

    groups = SERVE_GROUPS

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        listed: dict[str, list[tuple[str, str]]] = {title: [] for title, _ in self.groups}
        other: list[tuple[str, str]] = []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:  # hidden
                continue
            title = next((t for t, names in self.groups if param.name in names), None)
            (listed[title] if title is not None else other).append(record)
        for title, records in [*listed.items(), ("Other options", other)]:
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)
