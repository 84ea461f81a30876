//! [`Dag`]: a typed builder for a DAG of steps (`a -> b, a -> c, b & c -> d`),
//! compiled to the batch engine: a step with dependencies is the complete
//! callback (a flow parent) of the batch `<dag>:<step>` whose members are its
//! dependencies; a step feeding several later steps is a member of each of
//! their batches (its `batch` field holds their keys, one per line), so its
//! one ack counts it in every one of them in the same script. Validated
//! before any write; every id derives from the DAG id and the step name, so
//! `enqueue` may be repeated after a producer crash (docs/WORKFLOWS.md, "DAGs").

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tracing::debug;

use crate::enqueue_options::Enqueued;
use crate::error::QueueError;
use crate::queue::Queue;
use crate::scripts::batch_open::BatchOpen;

use super::engine::{BatchRef, MEMBER_FIELD};
use super::{ChildPolicy, JobSpec};

pub use crate::scripts::batch_open::DEFAULT_OPEN_TTL;

/// Why a [`Dag`] was refused (before anything was written), or why its
/// enqueue failed.
#[derive(Debug, thiserror::Error)]
pub enum DagError {
    /// No step at all.
    #[error("dag `{dag}`: no step")]
    Empty {
        /// The DAG id.
        dag: String,
    },
    /// Two steps with one name.
    #[error("dag `{dag}`: step `{step}` is defined twice")]
    DuplicateStep {
        /// The DAG id.
        dag: String,
        /// The step name.
        step: String,
    },
    /// A dependency names no step of the DAG.
    #[error("dag `{dag}`: step `{step}` depends on unknown step `{dependency}`")]
    UnknownStep {
        /// The DAG id.
        dag: String,
        /// The step that has the dependency.
        step: String,
        /// The name that is not a step.
        dependency: String,
    },
    /// A step depends on another twice.
    #[error("dag `{dag}`: step `{step}` depends on `{dependency}` twice")]
    DuplicateDependency {
        /// The DAG id.
        dag: String,
        /// The step that has the dependency.
        step: String,
        /// The dependency named twice.
        dependency: String,
    },
    /// The dependencies form a cycle: `cycle` lists it, first step repeated last.
    #[error("dag `{dag}`: cycle {}", cycle.join(" -> "))]
    Cycle {
        /// The DAG id.
        dag: String,
        /// The steps of the cycle, e.g. `["b", "c", "b"]`.
        cycle: Vec<String>,
    },
    /// `after` / `after_with` before any `step`.
    #[error("dag `{dag}`: `after({dependencies})` called before any step")]
    AfterWithoutStep {
        /// The DAG id.
        dag: String,
        /// The dependencies given.
        dependencies: String,
    },
    /// A DAG id or step name that cannot be part of a job id (empty, a
    /// control character, or a `:` in a step name).
    #[error("dag `{dag}`: invalid name {name:?} (non-empty, no control characters, no `:` in step names)")]
    InvalidName {
        /// The DAG id.
        dag: String,
        /// The refused name.
        name: String,
    },
    /// A queue error while enqueuing, at step `step`.
    #[error("dag `{dag}`, step `{step}`: {source}")]
    Queue {
        /// The DAG id.
        dag: String,
        /// The step being validated or enqueued.
        step: String,
        /// The queue error (it names the queue and batch or job).
        #[source]
        source: Box<QueueError>,
    },
}

#[derive(Debug, Clone)]
struct Step {
    name: String,
    spec: JobSpec,
    deps: Vec<(String, ChildPolicy)>,
}

/// A DAG of jobs: each step runs once, after all its dependencies finished,
/// and reads their results with
/// [`ctx.child_results::<T>()`](crate::JobContext::child_results) (ids
/// `<dag>:<step>`; [`Dag::step_name`] gives the step back). A dependency's
/// failure (dead-lettered, cancelled) acts on the step by its
/// [`ChildPolicy`] (default `FailParent`: the step is dead-lettered, and so,
/// transitively, the steps after it).
///
/// Job ids are `<dag id>:<step name>` (an id set on a step's spec is
/// replaced), so enqueuing the same DAG again creates nothing twice.
///
/// ```
/// # use queue_core::{BoxFuture, Job, JobContext, JobError, JobSpec, Dag, Queue};
/// # struct Step;
/// # impl Job for Step {
/// #     type Args = String;
/// #     const NAME: &'static str = "step";
/// #     const QUEUE: &'static str = "orders";
/// #     fn run(_: JobContext, _: String) -> BoxFuture<'static, Result<(), JobError>> { Box::pin(async { Ok(()) }) }
/// # }
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let server = queue_testkit::RedisServer::start().unwrap();
/// let queue = Queue::connect(&server.url()).await?;
/// let step = |s: &str| JobSpec::new::<Step>(&s.to_string());
/// let created = Dag::new("order-7")
///     .step("charge", step("charge")?)
///     .step("invoice", step("invoice")?).after(["charge"])
///     .step("email", step("email")?).after(["charge"])
///     .step("close", step("close")?).after(["invoice", "email"])
///     .enqueue(&queue)
///     .await?;
/// assert_eq!(created.roots.len(), 1); // `charge` is queued; the rest wait
/// let close = queue.batch("orders", "order-7:close").await?.unwrap();
/// assert_eq!((close.total, close.state.as_str()), (2, "sealed"));
///
/// let cyclic = Dag::new("bad")
///     .step("a", step("a")?).after(["b"])
///     .step("b", step("b")?).after(["a"])
///     .enqueue(&queue)
///     .await;
/// assert_eq!(cyclic.unwrap_err().to_string(), "dag `bad`: cycle a -> b -> a");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Dag {
    id: String,
    steps: Vec<Step>,
    open_ttl: Duration,
    misuse: Option<String>,
}

/// What [`Dag::enqueue`] created.
#[derive(Debug, Clone)]
pub struct DagCreated {
    /// The DAG id.
    pub id: String,
    /// Each step's name and job id, in a topological order.
    pub steps: Vec<(String, String)>,
    /// The enqueue outcome of each step without dependencies (the others
    /// are created when their dependencies finish); `Duplicate` on a repeat.
    pub roots: Vec<Enqueued>,
}

/// The largest DAG whose whole shape is stored on each of its batches
/// (`m_steps`, shown by `batches show` and the dashboard); a larger one
/// stores each step's own line there (see `Dag::meta_of`).
pub(crate) const DAG_SHAPE_FULL_MAX: usize = 256;

impl Dag {
    /// An empty DAG; `id` prefixes every job and batch id.
    pub fn new(id: impl Into<String>) -> Dag {
        Dag {
            id: id.into(),
            steps: Vec::new(),
            open_ttl: DEFAULT_OPEN_TTL,
            misuse: None,
        }
    }

    /// The DAG id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The job id of step `step` of DAG `dag`: `<dag>:<step>` (also the id
    /// of the batch the step waits on, when it has dependencies).
    pub fn step_id(dag: &str, step: &str) -> String {
        format!("{dag}:{step}")
    }

    /// The step name in a step's job id (what follows the last `:`), e.g.
    /// for the ids of [`ChildResult`](crate::ChildResult)s.
    ///
    /// ```
    /// assert_eq!(queue_core::Dag::step_name("order-7:charge"), "charge");
    /// ```
    pub fn step_name(job_id: &str) -> &str {
        job_id.rsplit(':').next().unwrap_or(job_id)
    }

    /// Adds step `name`: job `spec` (its id becomes `<dag>:<name>`).
    pub fn step(mut self, name: impl Into<String>, spec: JobSpec) -> Self {
        self.steps.push(Step {
            name: name.into(),
            spec,
            deps: Vec::new(),
        });
        self
    }

    /// The last added step runs after these steps (policy `FailParent`).
    pub fn after<I, S>(self, deps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.after_with(ChildPolicy::FailParent, deps)
    }

    /// The last added step runs after these steps, each under `policy`.
    pub fn after_with<I, S>(mut self, policy: ChildPolicy, deps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let deps: Vec<String> = deps.into_iter().map(Into::into).collect();
        match self.steps.last_mut() {
            Some(step) => step.deps.extend(deps.into_iter().map(|d| (d, policy))),
            None => {
                self.misuse.get_or_insert(deps.join(", "));
            }
        }
        self
    }

    /// How long the DAG's batches may stay open (a producer that died
    /// before sealing them): default [`DEFAULT_OPEN_TTL`] (3 days).
    pub fn open_ttl(mut self, ttl: Duration) -> Self {
        self.open_ttl = ttl;
        self
    }

    /// Checks the DAG without writing: names, duplicates, unknown
    /// dependencies, cycles, and each step's job as its enqueue would
    /// (queue name, id, extra field names: `DagError::Queue`). Returns the step indexes in a
    /// topological order (dependencies first).
    pub fn validate(&self) -> Result<Vec<usize>, DagError> {
        let dag = || self.id.clone();
        if let Some(deps) = &self.misuse {
            return Err(DagError::AfterWithoutStep {
                dag: dag(),
                dependencies: deps.clone(),
            });
        }
        if self.steps.is_empty() {
            return Err(DagError::Empty { dag: dag() });
        }
        let bad = |s: &str| s.is_empty() || s.chars().any(char::is_control);
        if bad(&self.id) {
            return Err(DagError::InvalidName {
                dag: dag(),
                name: self.id.clone(),
            });
        }
        let mut index = HashMap::new();
        for (i, s) in self.steps.iter().enumerate() {
            if bad(&s.name) || s.name.contains(':') {
                return Err(DagError::InvalidName {
                    dag: dag(),
                    name: s.name.clone(),
                });
            }
            if index.insert(s.name.as_str(), i).is_some() {
                return Err(DagError::DuplicateStep {
                    dag: dag(),
                    step: s.name.clone(),
                });
            }
        }
        let mut edges: Vec<Vec<usize>> = Vec::with_capacity(self.steps.len());
        for s in &self.steps {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            for (d, _) in &s.deps {
                let Some(&j) = index.get(d.as_str()) else {
                    return Err(DagError::UnknownStep {
                        dag: dag(),
                        step: s.name.clone(),
                        dependency: d.clone(),
                    });
                };
                if !seen.insert(j) {
                    return Err(DagError::DuplicateDependency {
                        dag: dag(),
                        step: s.name.clone(),
                        dependency: d.clone(),
                    });
                }
                out.push(j);
            }
            edges.push(out);
        }
        let order = self.topo_order(&edges)?;
        // No queue rule between steps: a dependency may be on any queue (the
        // relay carries its outcome to its dependents' batches), and each
        // step with dependencies is spawned by its own batch, on its own
        // queue. Each step's own job is checked as it will be sent, so that a
        // refusal comes before any batch is opened: a root as a member (queue
        // name, id, extra field names, the batch field of a dependency), a
        // step with dependencies as its batch's callback (queue name, id).
        let depended_on: HashSet<usize> = edges.iter().flatten().copied().collect();
        for (i, s) in self.steps.iter().enumerate() {
            let spec = s.spec.clone().id(Self::step_id(&self.id, &s.name));
            let checked = match s.deps.is_empty() {
                true => spec.check_member(depended_on.contains(&i)),
                false => spec.check_callback(),
            };
            checked.map_err(|source| DagError::Queue {
                dag: dag(),
                step: s.name.clone(),
                source: Box::new(source),
            })?;
        }
        Ok(order)
    }

    /// Depth-first topological sort; a back edge is reported as the cycle
    /// it closes, in dependency order (`a -> b -> a`: b after a, a after b).
    fn topo_order(&self, deps: &[Vec<usize>]) -> Result<Vec<usize>, DagError> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Active,
            Done,
        }
        let mut mark = vec![Mark::New; deps.len()];
        let mut order = Vec::with_capacity(deps.len());
        for start in 0..deps.len() {
            if mark[start] != Mark::New {
                continue;
            }
            // (node, next dependency to visit)
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            mark[start] = Mark::Active;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                if let Some(&dep) = deps[node].get(*next) {
                    *next += 1;
                    match mark[dep] {
                        Mark::New => {
                            mark[dep] = Mark::Active;
                            stack.push((dep, 0));
                        }
                        Mark::Active => {
                            // The stack holds dependents before their
                            // dependencies: reverse it from `dep` on.
                            let at = stack.iter().position(|&(n, _)| n == dep).unwrap_or(0);
                            let name = |n: usize| self.steps[n].name.clone();
                            let mut cycle = vec![name(dep)];
                            cycle.extend(stack[at + 1..].iter().rev().map(|&(n, _)| name(n)));
                            cycle.push(name(dep));
                            return Err(DagError::Cycle {
                                dag: self.id.clone(),
                                cycle,
                            });
                        }
                        Mark::Done => {}
                    }
                } else {
                    mark[node] = Mark::Done;
                    order.push(node);
                    stack.pop();
                }
            }
        }
        Ok(order)
    }

    /// The DAG's shape as stored on its batches (`m_steps`, one line per
    /// step: `name<TAB>dep,dep=continue,...`), shown by operators' views.
    fn describe(&self) -> String {
        self.describe_steps(&self.steps)
    }

    /// The metadata of step `i`'s batch: the DAG's id and its shape, whole
    /// for a DAG of at most [`DAG_SHAPE_FULL_MAX`] steps; for a larger one,
    /// only the step's own line and the number of steps (`m_steps_total`):
    /// the whole shape on every batch grew with the square of the DAG's
    /// size (about 90 KB a batch, 40 MB for 2,000 steps, kept 7 days after
    /// each batch fires).
    fn meta_of(&self, i: usize, whole: Option<&str>) -> Vec<(String, Vec<u8>)> {
        let steps = match whole {
            Some(whole) => whole.to_string(),
            None => self.describe_steps(std::slice::from_ref(&self.steps[i])),
        };
        let mut meta = vec![
            ("m_dag".to_string(), self.id.clone().into_bytes()),
            ("m_steps".to_string(), steps.into_bytes()),
        ];
        if whole.is_none() {
            meta.push((
                "m_steps_total".to_string(),
                self.steps.len().to_string().into_bytes(),
            ));
        }
        meta
    }

    fn describe_steps(&self, steps: &[Step]) -> String {
        steps
            .iter()
            .map(|s| {
                let deps: Vec<String> = s
                    .deps
                    .iter()
                    .map(|(d, p)| match p {
                        ChildPolicy::FailParent => d.clone(),
                        other => format!("{d}={}", other.as_arg()),
                    })
                    .collect();
                format!("{}\t{}", s.name, deps.join(","))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Validates, then writes: opens (and registers the dependencies of)
    /// the batch of every step that has dependencies, enqueues the steps
    /// without dependencies (each a member of its dependents' batches), and
    /// seals the batches. A crash half-way leaves open batches that never
    /// fire (and expire after [`open_ttl`](Self::open_ttl)): call `enqueue`
    /// again with the same DAG; nothing is created twice.
    pub async fn enqueue(self, queue: &Queue) -> Result<DagCreated, DagError> {
        let order = self.validate()?;
        let id = self.id.clone();
        let key_of = |s: &Step| BatchRef::new(&s.spec.queue, &Self::step_id(&id, &s.name));
        // Each step's dependents' batch keys: what its `batch` field holds.
        let mut member_of: Vec<Vec<String>> = vec![Vec::new(); self.steps.len()];
        let index: HashMap<&str, usize> = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        for s in &self.steps {
            for (d, _) in &s.deps {
                member_of[index[d.as_str()]].push(key_of(s).key);
            }
        }
        let whole = (self.steps.len() <= DAG_SHAPE_FULL_MAX).then(|| self.describe());
        let mut conn = queue.connection();
        let fail = |step: &Step| {
            let (dag, step) = (id.clone(), step.name.clone());
            move |source| DagError::Queue {
                dag,
                step,
                source: Box::new(source),
            }
        };
        let mut waiting = Vec::new();
        for &i in order.iter().rev() {
            let s = &self.steps[i];
            if s.deps.is_empty() {
                continue;
            }
            let batch = key_of(s);
            let mut spec = s.spec.clone().id(batch.id.clone());
            let member = member_of[i].join("\n");
            let fields =
                spec.callback_fields("c_", (!member.is_empty()).then_some(member.as_str()));
            BatchOpen {
                queue: &batch.queue,
                key: &batch.key,
                policy: ChildPolicy::FailParent.as_arg(),
                spec: &fields,
            }
            .run_with(&mut conn, self.open_ttl, &self.meta_of(i, whole.as_deref()))
            .await
            .map_err(fail(s))?;
            for policy in [
                ChildPolicy::FailParent,
                ChildPolicy::Continue,
                ChildPolicy::Ignore,
            ] {
                let ids: Vec<(&str, String)> = s
                    .deps
                    .iter()
                    .filter(|(_, p)| *p == policy)
                    .map(|(d, _)| {
                        let queue = self.steps[index[d.as_str()]].spec.queue.as_str();
                        (queue, Self::step_id(&id, d))
                    })
                    .collect();
                let ids: Vec<(&str, &str)> =
                    ids.iter().map(|(q, step)| (*q, step.as_str())).collect();
                batch
                    .register(&mut conn, policy.as_arg(), &ids)
                    .await
                    .map_err(fail(s))?;
            }
            waiting.push((i, batch));
        }
        let mut roots = Vec::new();
        for &i in &order {
            let s = &self.steps[i];
            if !s.deps.is_empty() {
                continue;
            }
            let step_id = Self::step_id(&id, &s.name);
            let max = s.spec.opts.max_attempts.unwrap_or(s.spec.max_attempts);
            let mut opts = s.spec.opts.clone().id(step_id).max_attempts(max);
            if !member_of[i].is_empty() {
                opts = opts.extra_field(MEMBER_FIELD, member_of[i].join("\n"));
            }
            let done = queue
                .enqueue_raw_batch(
                    &s.spec.queue,
                    &s.spec.job_type,
                    s.spec.version,
                    max,
                    vec![(opts, s.spec.payload.clone())],
                )
                .await
                .map_err(fail(s))?;
            roots.extend(done);
        }
        // Dependencies first: a batch whose members all finished fires at
        // its seal, and the step it spawns may already count in the next.
        for (i, batch) in waiting.iter().rev() {
            batch.seal(&mut conn).await.map_err(fail(&self.steps[*i]))?;
        }
        debug!(queue = %self.steps[order[0]].spec.queue, dag = %id, steps = self.steps.len(), "dag enqueued");
        Ok(DagCreated {
            steps: order
                .iter()
                .map(|&i| {
                    let name = self.steps[i].name.clone();
                    let job = Self::step_id(&id, &name);
                    (name, job)
                })
                .collect(),
            id,
            roots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(q: &str) -> JobSpec {
        JobSpec::raw(q, "t", 1, 3, vec![0xc0])
    }

    fn diamond() -> Dag {
        Dag::new("d1")
            .step("a", spec("q"))
            .step("b", spec("q"))
            .after(["a"])
            .step("c", spec("q"))
            .after(["a"])
            .step("d", spec("q"))
            .after(["b", "c"])
    }

    #[test]
    fn diamond_orders_dependencies_first() {
        let dag = diamond();
        let order = dag.validate().unwrap();
        let pos = |n: &str| order.iter().position(|&i| dag.steps[i].name == n).unwrap();
        assert!(pos("a") < pos("b") && pos("a") < pos("c"));
        assert!(pos("b") < pos("d") && pos("c") < pos("d"));
    }

    #[test]
    fn refusals_name_the_dag_and_step() {
        let e = Dag::new("x").validate().unwrap_err();
        assert_eq!(e.to_string(), "dag `x`: no step");
        let e = Dag::new("x")
            .step("a", spec("q"))
            .step("a", spec("q"))
            .validate()
            .unwrap_err();
        assert!(
            matches!(e, DagError::DuplicateStep { ref step, .. } if step == "a"),
            "{e}"
        );
        let e = Dag::new("x")
            .step("a", spec("q"))
            .after(["zz"])
            .validate()
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "dag `x`: step `a` depends on unknown step `zz`"
        );
        let e = Dag::new("x")
            .step("a", spec("q"))
            .step("b", spec("q"))
            .after(["a", "a"])
            .validate()
            .unwrap_err();
        assert!(matches!(e, DagError::DuplicateDependency { .. }), "{e}");
        let e = Dag::new("x")
            .after(["a"])
            .step("a", spec("q"))
            .validate()
            .unwrap_err();
        assert!(matches!(e, DagError::AfterWithoutStep { .. }), "{e}");
        let e = Dag::new("x").step("a:b", spec("q")).validate().unwrap_err();
        assert!(matches!(e, DagError::InvalidName { .. }), "{e}");
    }

    #[test]
    fn a_cycle_is_named_in_dependency_order() {
        let e = Dag::new("x")
            .step("a", spec("q"))
            .step("b", spec("q"))
            .after(["a", "d"])
            .step("c", spec("q"))
            .after(["b"])
            .step("d", spec("q"))
            .after(["c"])
            .validate()
            .unwrap_err();
        assert_eq!(e.to_string(), "dag `x`: cycle b -> c -> d -> b");
        let e = Dag::new("x")
            .step("a", spec("q"))
            .after(["a"])
            .validate()
            .unwrap_err();
        assert_eq!(e.to_string(), "dag `x`: cycle a -> a");
    }

    #[test]
    fn dependencies_may_be_on_other_queues() {
        let order = Dag::new("x")
            .step("a", spec("other"))
            .step("b", spec("q"))
            .after(["a"])
            .validate()
            .unwrap();
        assert_eq!(order.len(), 2);
    }
}
