"""A Hydra launcher that runs each sweep point as a Ray task, on an existing cluster or a local one.

Why our own: ``hydra-ray-launcher`` (1.2.2, the last release) pins ``ray~=1.12``, which has no
wheel for the Python this project runs on. This one is small: the driver connects to the cluster
at ``address`` (or starts a local one declaring ``hardware_<name>`` resources, see
``pipeline.engine.cluster``), submits every point as a task with ``max_calls=1`` (a fresh worker
process each, so a point never inherits another's thread pools or sessions), and collects Hydra's
``JobReturn``s. Inside a point the address is exported as ``PIPELINE_RAY_ADDRESS``, so the
pipeline sends its timed stages to a node labelled for the target. Registered like Hydra's own
plugins: a module in the ``hydra_plugins`` namespace package plus a ConfigStore entry.
"""

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)
ADDRESS_ENV = "PIPELINE_RAY_ADDRESS"


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.pipeline_ray_launcher.ray_launcher.RayLauncher"
    address: Optional[str] = None   # an existing cluster ("host:port" or "auto"); null = local
    num_cpus: Optional[int] = None  # local cluster only: CPU slots (null = every core)
    cpus_per_point: float = 1.0     # CPU slots one point holds while it compiles


ConfigStore.instance().store(group="hydra/launcher", name="ray", node=RayLauncherConf,
                             provider="pipeline")


def _point(idx: int, overrides: Sequence[str], hydra_context: HydraContext, config: DictConfig,
           task_function: TaskFunction, singleton_state: dict, address: str) -> JobReturn:
    """One point, in its own Ray worker process (as hydra-joblib-launcher's execute_job)."""
    setup_globals()
    Singleton.set_state(singleton_state)
    os.environ[ADDRESS_ENV] = address
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(hydra_context=hydra_context, config=sweep_config, task_function=task_function,
                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


class RayLauncher(Launcher):
    def __init__(self, address: Optional[str] = None, num_cpus: Optional[int] = None,
                 cpus_per_point: float = 1.0) -> None:
        self.address, self.num_cpus, self.cpus_per_point = address, num_cpus, cpus_per_point
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def _connect(self, job_overrides: Sequence[Sequence[str]]) -> tuple[Any, str]:
        import ray

        from pipeline.engine.cluster import resource

        if ray.is_initialized():
            return ray, ray.get_runtime_context().gcs_address
        if self.address:
            ray.init(address=self.address, logging_level="ERROR", log_to_driver=True)
        else:  # a local cluster: this machine is one node of every target named in the sweep
            names = {str(self.hydra_context.config_loader.load_sweep_config(
                self.config, list(o)).hardware.name) for o in job_overrides}
            ray.init(address="local", num_cpus=self.num_cpus,
                     resources={resource(n): 1 for n in names},
                     include_dashboard=False, logging_level="ERROR", log_to_driver=True)
        return ray, ray.get_runtime_context().gcs_address

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
               ) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        ray, address = self._connect(job_overrides)
        log.info(f"Ray launcher: {len(job_overrides)} jobs on the cluster at {address}, "
                 f"sweep output dir: {sweep_dir}")
        for idx, overrides in enumerate(job_overrides):
            log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
        # max_calls=1: the worker process exits after its point; the next one starts clean.
        point = ray.remote(num_cpus=self.cpus_per_point, max_calls=1)(_point)
        state = Singleton.get_state()
        refs = [point.remote(initial_job_idx + idx, list(o), self.hydra_context, self.config,
                             self.task_function, state, address)
                for idx, o in enumerate(job_overrides)]
        return ray.get(refs)
