//! The CLI's end-to-end tests, one binary (each former test file is a module):
//! real `fencelock` processes on free ports of 127.0.0.1, started through `support`.

mod support;

mod admin;
mod backup_restore;
mod bad_input;
mod cli_surface;
mod cluster;
mod cluster_status;
mod conn_limits;
mod container;
mod crash_restart;
mod dashboard;
mod data_dir;
mod demo;
mod elect;
mod failover;
mod full_disk;
mod getting_started;
mod holder_identity;
mod http_cluster;
mod http_guide;
mod jobs;
mod multi_lock;
mod no_fault_hooks;
mod notify;
mod package;
mod partition;
mod paused_holder;
mod refusals;
mod rmw_paused;
mod run_descendants;
mod run_exclusive;
mod server_list;
mod shared;
mod storage_tls;
mod tls;
mod top;
mod watch;
