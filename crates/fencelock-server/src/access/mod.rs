//! Access control of a node: who may connect, who is calling and what they
//! may do, how much of the service each caller may take, and the record of
//! what was refused.
//!
//! Where it sits: below the Raft group and the API, which call it; it calls
//! nothing of theirs. [`conn_limits`] admits connections (through [`tls`],
//! whose certificates [`certs`] makes); [`auth`] names the caller of each
//! request from the auth file and the group's policy (whose rules are in
//! [`policy`]); [`quota`] bounds what an identity holds and how fast it asks;
//! [`audit`] records refusals and changes.

pub mod audit;
pub mod auth;
pub mod certs;
pub mod conn_limits;
pub mod policy;
pub mod quota;
pub mod tls;
