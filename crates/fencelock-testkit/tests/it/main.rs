//! The testkit's tests, one binary: the real servers in their production
//! configurations, and the workspace's import-cycle check.

mod docs_links;
mod module_graph;
mod production;
