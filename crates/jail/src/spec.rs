//! What the supervisor hands the helper, through descriptor 3 (never argv or the environment).

use airlock_policy::Plan;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperSpec {
    pub plan: Plan,
    /// The helper exits at once if its parent is not this process (it died before we started).
    pub supervisor_pid: libc::pid_t,
    /// Files the helper writes `0` to, first thing, to join the sandbox's cgroup.
    pub cgroup_join: Vec<std::path::PathBuf>,
}
