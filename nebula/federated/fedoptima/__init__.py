"""FedOptima (offloaded asynchronous training): device-side layers with an auxiliary network and a local loss,
the server's central training over activations with the Task Scheduler, grants under the cap ω, asynchronous
aggregation of device models, and measured idle time; `simulate` runs it and its baselines on a virtual clock."""
from nebula.federated.fedoptima.auxiliary import default_auxiliary
from nebula.federated.fedoptima.config import FedOptimaSpec
from nebula.federated.fedoptima.engine import AsyncAggregator, DeviceTrainer, ServerTrainer, split_model
from nebula.federated.fedoptima.messages import TO_DEVICE, TO_SERVER
from nebula.federated.fedoptima.runtime import FedOptimaError, ServerResult, Task, run_device, serve
from nebula.federated.fedoptima.scheduler import ActivationBatch, ModelUpdate, SchedulerError, TaskScheduler
from nebula.federated.fedoptima.simulate import SimResult, SimSetting, simulate
from nebula.federated.fedoptima.split import DeviceInfo, LayerCostPerSample, check_split, profile_layers, split_point

__all__ = ["default_auxiliary", "FedOptimaSpec", "AsyncAggregator", "DeviceTrainer", "ServerTrainer", "split_model",
           "TO_DEVICE", "TO_SERVER", "FedOptimaError", "ServerResult",
           "Task", "run_device", "serve", "ActivationBatch", "ModelUpdate", "SchedulerError", "TaskScheduler",
           "SimResult", "SimSetting", "simulate", "DeviceInfo", "LayerCostPerSample", "check_split", "profile_layers",
           "split_point"]
