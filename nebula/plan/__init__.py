"""Which cross-cluster mode to run on a link: the link model and `nebula plan`'s table."""
from nebula.plan.link import WanLink, exchange_s, parse_link, predicted_wall_s
from nebula.plan.sizing import JobSize, config_params, safetensors_params, size_job
from nebula.plan.table import Plan, PlanRow, Table, format_plan, load_table, make_plan

__all__ = ["WanLink", "parse_link", "exchange_s", "predicted_wall_s", "JobSize", "size_job", "config_params",
           "safetensors_params", "Table", "Plan", "PlanRow", "load_table", "make_plan", "format_plan"]
