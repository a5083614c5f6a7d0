"""FedOptima (offloaded asynchronous training): device-side layers with an auxiliary network and a local loss,
the server's central training over activations with the Task Scheduler, grants under the cap ω, asynchronous
aggregation of device models, and measured idle time."""
from nebula.federated.fedoptima.auxiliary import default_auxiliary
from nebula.federated.fedoptima.engine import AsyncAggregator, DeviceTrainer, ServerTrainer, split_model
from nebula.federated.fedoptima.scheduler import ActivationBatch, ModelUpdate, SchedulerError, TaskScheduler
from nebula.federated.fedoptima.split import DeviceInfo, LayerProfile, check_split, profile_layers, split_point

__all__ = ["default_auxiliary", "AsyncAggregator", "DeviceTrainer", "ServerTrainer", "split_model",
           "ActivationBatch", "ModelUpdate", "SchedulerError", "TaskScheduler", "DeviceInfo", "LayerProfile",
           "check_split", "profile_layers", "split_point"]
