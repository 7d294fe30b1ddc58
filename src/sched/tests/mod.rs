//! The scheduler's test harness, Nomad style: a [`Scenario`] is nodes (with
//! what running jobs hold), pending jobs and `now`; running it plans once and
//! checks the invariants every plan must keep; an expectation table then says
//! where each job went or why it waits. New policies add rows, not harness.

mod backfill;
mod backfill_sim;
mod checks;
mod constraints;
mod delay;
mod elastic;
mod fragmentation;
mod mig;
mod packing;
mod policy;
mod policy_sim;
mod ports;
mod props;
mod reservations;
mod restart;
mod scenarios;
mod topology;

use std::collections::BTreeSet;

use crate::model::{
    Allocation, GpuInfo, GpuLink, JobId, Millis, NodeAllocation, NodeInventory, NumaNode,
    Placement, TopologyRequirement,
};

use super::{
    check_allocation, plan, ClusterView, NodeState, NodeView, PendingJob, PendingReason, Plan,
    Usage,
};

/// All GPUs of an 8-GPU node.
pub const ALL8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

/// How a node's GPUs are wired. GPUs `0..n/2` sit on NUMA 0, the rest on NUMA 1.
#[derive(Clone, Copy, Debug)]
pub enum Topo {
    /// Every pair over NVSwitch (DGX H100): all equally close.
    NvSwitch,
    /// NVLink between pairs (0,1), (2,3), ...; PCIe host bridge within a NUMA
    /// node; the SMP link across.
    NvLinkPairs,
    /// PCIe only: pairs share a switch, then the host bridge, then across NUMA.
    Pcie,
}

fn numa_of(i: u32, n: u32) -> u32 {
    if n >= 2 && i >= n / 2 {
        1
    } else {
        0
    }
}

/// The link matrix of `n` GPUs wired as `topo`.
pub fn links(n: u32, topo: Topo) -> Vec<Vec<GpuLink>> {
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    let same_numa = numa_of(i, n) == numa_of(j, n);
                    match topo {
                        _ if i == j => GpuLink::SelfLink,
                        Topo::NvSwitch => GpuLink::NvLink(18),
                        Topo::NvLinkPairs if i / 2 == j / 2 => GpuLink::NvLink(4),
                        Topo::Pcie if i / 2 == j / 2 => GpuLink::PcieSwitch,
                        _ if same_numa => GpuLink::HostBridge,
                        _ => GpuLink::CrossNuma,
                    }
                })
                .collect()
        })
        .collect()
}

/// Builds one node of a scenario.
#[derive(Clone, Debug)]
pub struct NodeBuilder {
    view: NodeView,
}

/// A node with no GPUs, 64 CPUs and 256 GiB.
pub fn node(name: &str) -> NodeBuilder {
    let inventory = NodeInventory {
        name: name.to_string(),
        gpus: Vec::new(),
        gpu_links: Vec::new(),
        numa: Vec::new(),
        cpus: 64,
        memory_mb: 256 * 1024,
        topology: String::new(),
        features: Vec::new(),
    };
    NodeBuilder {
        view: NodeView::new(inventory, NodeState::Up),
    }
    .numa()
}

/// A DGX-like node: 8 GPUs on NVSwitch, NUMA 0 (GPUs 0-3) and 1 (4-7),
/// 128 CPUs, 1 TiB.
pub fn dgx(name: &str) -> NodeBuilder {
    node(name).gpus(8, Topo::NvSwitch).cpus(128).mem_gb(1024)
}

/// A DGX-1-like node: 8 GPUs with NVLink pairs, 128 CPUs, 1 TiB.
pub fn dgx_pairs(name: &str) -> NodeBuilder {
    node(name).gpus(8, Topo::NvLinkPairs).cpus(128).mem_gb(1024)
}

impl NodeBuilder {
    /// `n` GPUs wired as `topo`.
    pub fn gpus(mut self, n: u32, topo: Topo) -> Self {
        let inv = &mut self.view.inventory;
        inv.gpus = (0..n)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{}-{i}", inv.name),
                model: "NVIDIA H100 80GB HBM3".into(),
                memory_mb: 80 * 1024,
                pci_bus_id: format!("00000000:{:02x}:00.0", 0x18 + i),
                numa_node: Some(numa_of(i, n)),
                healthy: true,
                fault: None,
                mig: None,
            })
            .collect();
        inv.gpu_links = links(n, topo);
        self
    }

    pub fn cpus(mut self, n: u32) -> Self {
        self.view.inventory.cpus = n;
        self.numa()
    }

    pub fn mem_gb(mut self, gb: u64) -> Self {
        self.view.inventory.memory_mb = gb * 1024;
        self.numa()
    }

    /// A CPU count declared in the agent's config, as simulated nodes have:
    /// the NUMA layout keeps the CPUs it had, so they no longer match.
    pub fn declared_cpus(mut self, n: u32) -> Self {
        self.view.inventory.cpus = n;
        self
    }

    /// Marks GPU `index` faulty.
    pub fn unhealthy(mut self, index: u32) -> Self {
        for g in &mut self.view.inventory.gpus {
            if g.index == index {
                g.healthy = false;
                g.fault = Some("XID 79: fallen off the bus".into());
            }
        }
        self
    }

    /// The node's topology path, e.g. `s1/l2`.
    pub fn topo(mut self, path: &str) -> Self {
        self.view.inventory.topology = path.to_string();
        self
    }

    /// The node's features.
    pub fn features(mut self, features: &[&str]) -> Self {
        self.view.inventory.features = features.iter().map(|f| f.to_string()).collect();
        self
    }

    /// Every GPU's model name.
    pub fn model(mut self, model: &str) -> Self {
        for g in &mut self.view.inventory.gpus {
            g.model = model.to_string();
        }
        self
    }

    pub fn state(mut self, state: NodeState) -> Self {
        self.view.state = state;
        self
    }

    pub fn drained(self) -> Self {
        self.state(NodeState::Drained)
    }

    pub fn down(self) -> Self {
        self.state(NodeState::Down)
    }

    /// Two NUMA nodes splitting CPUs and memory (informational for now).
    fn numa(mut self) -> Self {
        let inv = &mut self.view.inventory;
        let half = inv.cpus / 2;
        inv.numa = vec![
            NumaNode {
                id: 0,
                cpus: (0..half).collect(),
                memory_mb: inv.memory_mb / 2,
            },
            NumaNode {
                id: 1,
                cpus: (half..inv.cpus).collect(),
                memory_mb: inv.memory_mb - inv.memory_mb / 2,
            },
        ];
        self
    }

    pub fn build(self) -> NodeView {
        self.view
    }
}

/// Builds one pending job. Defaults: 1 node, 1 task, 1 CPU, no GPU, default
/// memory, priority 0, submitted at time `id` (so ids are FIFO order).
#[derive(Clone, Debug)]
pub struct JobBuilder {
    job: PendingJob,
}

pub fn job(id: u64) -> JobBuilder {
    JobBuilder {
        job: PendingJob {
            id: JobId(id),
            user: "alice".into(),
            nodes: 1,
            ntasks_per_node: 1,
            gpus_per_node: 0,
            cpus_per_task: 1,
            mem_per_node_mb: None,
            submit_time: id,
            priority: 0,
            total_gpus: None,
            placement: Placement::default(),
            time_limit_secs: None,
            begin_time: None,
            blocked: None,
            array_throttle: None,
            singleton: None,
            previous: Vec::new(),
            account: Default::default(),
            qos: Default::default(),
            partition: Default::default(),
            nice: 0,
            exclusive: false,
        },
    }
}

impl JobBuilder {
    pub fn nodes(mut self, n: u32) -> Self {
        self.job.nodes = n;
        self
    }
    /// `--nodes MIN-MAX`: an elastic job, waiting at MIN.
    pub fn elastic(mut self, min: u32, max: u32) -> Self {
        self.job.nodes = min;
        self.job.placement.elastic = Some(crate::model::NodeRange { min, max });
        self
    }

    pub fn gpus(mut self, n: u32) -> Self {
        self.job.gpus_per_node = n;
        self
    }
    pub fn tasks(mut self, n: u32) -> Self {
        self.job.ntasks_per_node = n;
        self
    }
    pub fn cpus(mut self, n: u32) -> Self {
        self.job.cpus_per_task = n;
        self
    }
    pub fn mem_gb(mut self, gb: u64) -> Self {
        self.job.mem_per_node_mb = Some(gb * 1024);
        self
    }
    pub fn submit(mut self, t: Millis) -> Self {
        self.job.submit_time = t;
        self
    }
    pub fn prio(mut self, p: i64) -> Self {
        self.job.priority = p;
        self
    }
    /// `--gpus n`: the shape is the pass's choice (1 × n until then).
    pub fn total(mut self, n: u32) -> Self {
        self.job.total_gpus = Some(n);
        self.job.nodes = 1;
        self.job.gpus_per_node = n;
        self
    }
    pub fn gpu_type(mut self, t: &str) -> Self {
        self.job.placement.gpu_type = Some(t.into());
        self
    }
    pub fn constraint(mut self, features: &[&str]) -> Self {
        self.job.placement.features = features.iter().map(|f| f.to_string()).collect();
        self
    }
    pub fn nodelist(mut self, names: &[&str]) -> Self {
        self.job.placement.nodelist = names.iter().map(|f| f.to_string()).collect();
        self
    }
    pub fn exclude(mut self, names: &[&str]) -> Self {
        self.job.placement.exclude = names.iter().map(|f| f.to_string()).collect();
        self
    }
    pub fn account(mut self, a: &str) -> Self {
        self.job.account = a.into();
        self
    }
    pub fn qos(mut self, q: &str) -> Self {
        self.job.qos = q.into();
        self
    }
    pub fn partition(mut self, p: &str) -> Self {
        self.job.partition = p.into();
        self
    }
    pub fn user(mut self, u: &str) -> Self {
        self.job.user = u.into();
        self
    }
    pub fn exclusive(mut self) -> Self {
        self.job.exclusive = true;
        self
    }

    pub fn nice(mut self, n: i32) -> Self {
        self.job.nice = n;
        self
    }
    pub fn topology(mut self, level: TopologyRequirement) -> Self {
        self.job.placement.topology = Some(level);
        self
    }
    /// `--time` in seconds.
    pub fn time(mut self, secs: u64) -> Self {
        self.job.time_limit_secs = Some(secs);
        self
    }
    pub fn begin(mut self, t: Millis) -> Self {
        self.job.begin_time = Some(t);
        self
    }
    /// Kept back by the state (a hold, dependencies).
    pub fn blocked(mut self, r: PendingReason) -> Self {
        self.job.blocked = Some(r);
        self
    }
    /// A task of array `array` with `slots` more tasks allowed to start.
    pub fn array(mut self, array: u64, slots: u32) -> Self {
        self.job.array_throttle = Some(super::ArrayThrottle {
            array: JobId(array),
            slots,
        });
        self
    }
    pub fn singleton(mut self, name: &str) -> Self {
        self.job.singleton = Some(name.into());
        self
    }
    /// A restart: the last attempt ran on these nodes (rank order) and GPUs,
    /// with 1 CPU and 1 GiB each.
    pub fn previous(mut self, nodes: &[(&str, &[u32])]) -> Self {
        self.job.previous = nodes
            .iter()
            .map(|(n, g)| NodeAllocation {
                node: n.to_string(),
                gpus: g.to_vec(),
                cpus: Vec::new(),
                cpu_count: 1,
                memory_mb: 1024,
            })
            .collect();
        self
    }
    pub fn build(self) -> PendingJob {
        self.job
    }
}

/// What a running job holds on one node: GPUs, and a cpuset of `cpus`, 1 GiB.
pub fn held_cpus(job: u64, node: &str, gpus: &[u32], cpus: std::ops::Range<u32>) -> Allocation {
    let cpus: Vec<u32> = cpus.collect();
    let mut a = held_full(job, node, gpus, cpus.len() as u32, 1024);
    a.nodes[0].cpus = cpus;
    a
}

/// What a running job holds on one node: GPUs, 1 CPU, 1 GiB.
pub fn held(job: u64, node: &str, gpus: &[u32]) -> Allocation {
    held_full(job, node, gpus, 1, 1024)
}

/// What a running job holds on one node, with CPUs and memory.
pub fn held_full(job: u64, node: &str, gpus: &[u32], cpus: u32, memory_mb: u64) -> Allocation {
    Allocation {
        job: JobId(job),
        nodes: vec![NodeAllocation {
            node: node.into(),
            gpus: gpus.to_vec(),
            cpus: Vec::new(),
            cpu_count: cpus,
            memory_mb,
        }],
    }
}

/// Nodes, running jobs, pending jobs and `now`.
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    pub view: ClusterView,
    pub now: Millis,
}

impl Scenario {
    pub fn new(nodes: impl IntoIterator<Item = NodeBuilder>) -> Scenario {
        Scenario {
            view: ClusterView {
                nodes: nodes.into_iter().map(NodeBuilder::build).collect(),
                pending: Vec::new(),
                ..Default::default()
            },
            now: 1_000_000,
        }
    }

    /// A running job: its resources are charged to the nodes it names.
    pub fn running(mut self, alloc: Allocation) -> Scenario {
        for na in &alloc.nodes {
            let node = self
                .view
                .nodes
                .iter_mut()
                .find(|n| n.name == na.node)
                .unwrap_or_else(|| panic!("scenario: no node {}", na.node));
            node.used.charge(na);
        }
        self
    }

    /// A running job expected to end at `end` (start + time limit).
    pub fn running_until(mut self, alloc: Allocation, end: Millis) -> Scenario {
        self.view.running.push(super::RunningJob {
            id: alloc.job,
            allocation: alloc.clone().into(),
            expected_end: Some(end),
        });
        self.running(alloc)
    }

    pub fn pending(mut self, jobs: impl IntoIterator<Item = JobBuilder>) -> Scenario {
        self.view
            .pending
            .extend(jobs.into_iter().map(JobBuilder::build));
        self
    }

    /// Changes the scenario in place (for what a builder does not say).
    pub fn tap(mut self, f: impl FnOnce(&mut Scenario)) -> Scenario {
        f(&mut self);
        self
    }

    /// Sets the state of node `name`.
    pub fn node_state(&mut self, name: &str, state: NodeState) {
        let node = self.view.nodes.iter_mut().find(|n| n.name == name);
        node.unwrap_or_else(|| panic!("scenario: no node {name}"))
            .state = state;
    }

    /// A MASTER_PORT range of `n` ports, and how many of them running jobs
    /// with rank 0 on each named node hold.
    pub fn master_ports(mut self, n: u32, held: &[(&str, u32)]) -> Scenario {
        self.view.master_ports = Some(n);
        for (name, k) in held {
            self.node_state(name, NodeState::Up);
            if let Some(node) = self.view.nodes.iter_mut().find(|v| v.name == *name) {
                node.used.master_ports = *k;
            }
        }
        self
    }

    /// Plans once and checks what every plan must hold (see [`assert_sound`]).
    pub fn run(&self) -> Outcome {
        // As the leader runs a pass: nodes and pending jobs borrowed, the
        // rest of the view without them, so nothing in a pass may read them
        // from `rest`.
        let rest = ClusterView {
            nodes: Vec::new(),
            pending: Vec::new(),
            ..self.view.clone()
        };
        let borrowed = crate::sched::ViewRef {
            nodes: self.view.nodes.iter().collect(),
            pending: self.view.pending.iter().collect(),
            rest: &rest,
        };
        let plan = crate::sched::plan_ref(&borrowed, self.now, crate::sched::Packing::BestFit);
        assert_sound(&self.view, &plan, self.now);
        assert_no_delay(&self.view, &plan, self.now);
        Outcome { plan }
    }
}

/// What every plan keeps, whatever the policy: each pending job appears exactly
/// once (placed or with a reason); allocations, applied in order as apply does,
/// each pass [`check_allocation`] (so nothing is oversubscribed, no cpusets
/// overlap, nothing lands on a node that is not up, on a faulty GPU, on a node
/// the job's placement rules out or across domains its `--topology` forbids);
/// and no job is placed behind one that waits for `Resources` or `Topology`
/// (FIFO).
pub fn assert_sound(view: &ClusterView, plan: &Plan, now: Millis) {
    let mut seen = BTreeSet::new();
    for id in plan
        .allocations
        .iter()
        .map(|a| a.job)
        .chain(plan.pending.iter().map(|p| p.0))
    {
        assert!(seen.insert(id), "job {id} appears twice in the plan");
    }
    let wanted: BTreeSet<JobId> = view.pending.iter().map(|j| j.id).collect();
    assert_eq!(
        seen, wanted,
        "the plan must cover every pending job exactly once"
    );

    let mut nodes = view.nodes.clone();
    for alloc in &plan.allocations {
        let job = view
            .pending
            .iter()
            .find(|j| j.id == alloc.job)
            .expect("placed job is pending");
        if let Err(why) = check_allocation(&nodes, alloc, job) {
            panic!("allocation {alloc:?} fails re-validation: {why}");
        }
        for na in &alloc.nodes {
            let node = nodes
                .iter_mut()
                .find(|n| n.name == na.node)
                .expect("node exists");
            node.used.charge(na);
        }
    }

    let rank = queue_rank(view, now);
    let key = |id: JobId| rank[&id];
    let head = plan
        .pending
        .iter()
        .filter(|(_, r)| {
            matches!(
                r,
                PendingReason::Resources | PendingReason::Topology(_) | PendingReason::NoMasterPort
            )
        })
        .min_by_key(|(id, _)| key(*id));
    if let Some((head, _)) = head {
        if plan.expected_start(*head).is_none() {
            for alloc in &plan.allocations {
                assert!(
                    key(alloc.job) < key(*head),
                    "job {} was placed behind a blocked job without a reservation",
                    alloc.job
                );
            }
        }
    }
}

/// Each pending job's place in the pass's queue order (`queue_order`).
fn queue_rank(view: &ClusterView, now: Millis) -> std::collections::BTreeMap<JobId, usize> {
    crate::sched::queue_order(view, now)
        .iter()
        .enumerate()
        .map(|(i, (j, _))| (j.id, i))
        .collect()
}

pub use delay::assert_no_delay;

/// A plan, with lookups by job id.
#[derive(Debug)]
pub struct Outcome {
    pub plan: Plan,
}

/// One row of a placement table: a named scenario and where each job should
/// end up.
pub struct Case {
    pub name: &'static str,
    pub scenario: Scenario,
    pub expect: Vec<(u64, Expect)>,
}

/// Runs every row; fails listing every mismatch, one line each.
pub fn run_table(cases: Vec<Case>) {
    let mut failures = Vec::new();
    for case in cases {
        for m in case.scenario.run().mismatches(&case.expect) {
            failures.push(format!("{}: {m}", case.name));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Where one job should end up.
#[derive(Clone, Debug)]
pub enum Expect {
    /// Placed on exactly these nodes (in rank order) and GPU indices.
    On(&'static [(&'static str, &'static [u32])]),
    /// Placed on exactly these nodes, in rank order (GPUs not compared).
    Nodes(&'static [&'static str]),
    /// Waiting for this reason.
    Waits(PendingReason),
    /// Unsatisfiable, with a reason containing this text.
    Unsatisfiable(&'static str),
}

impl Outcome {
    /// Node names and GPU indices of `job`'s allocation, in rank order.
    pub fn placement(&self, job: u64) -> Option<Vec<(String, Vec<u32>)>> {
        self.plan
            .allocations
            .iter()
            .find(|a| a.job == JobId(job))
            .map(|a| {
                a.nodes
                    .iter()
                    .map(|n| (n.node.clone(), n.gpus.clone()))
                    .collect()
            })
    }

    pub fn expected_start(&self, job: u64) -> Option<Millis> {
        self.plan.expected_start(JobId(job))
    }

    pub fn allocation(&self, job: u64) -> Option<&Allocation> {
        self.plan.allocations.iter().find(|a| a.job == JobId(job))
    }

    pub fn reason(&self, job: u64) -> Option<&PendingReason> {
        self.plan
            .pending
            .iter()
            .find(|p| p.0 == JobId(job))
            .map(|p| &p.1)
    }

    /// Mismatches between the plan and `table`, one sentence each.
    pub fn mismatches(&self, table: &[(u64, Expect)]) -> Vec<String> {
        let mut out = Vec::new();
        for (job, want) in table {
            let placed = self.placement(*job);
            let reason = self.reason(*job);
            let got = match (&placed, reason) {
                (Some(p), _) => format!("placed on {p:?}"),
                (None, Some(r)) => format!("pending: {r:?}"),
                (None, None) => "absent".into(),
            };
            let ok = match want {
                Expect::On(nodes) => placed.as_ref().is_some_and(|p| {
                    p.len() == nodes.len()
                        && p.iter()
                            .zip(nodes.iter())
                            .all(|((n, g), (wn, wg))| n == wn && g.as_slice() == *wg)
                }),
                Expect::Nodes(nodes) => placed
                    .as_ref()
                    .is_some_and(|p| p.iter().map(|(n, _)| n.as_str()).eq(nodes.iter().copied())),
                Expect::Waits(r) => reason == Some(r),
                Expect::Unsatisfiable(text) => matches!(
                    reason,
                    Some(PendingReason::Unsatisfiable(why)) if why.contains(text)
                ),
            };
            if !ok {
                out.push(format!("job {job}: expected {want:?}, got {got}"));
            }
        }
        out
    }
}
