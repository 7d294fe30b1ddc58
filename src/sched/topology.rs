//! Topology domains and where a gang goes among them.
//!
//! A node declares its place as a path, `spine1/leaf3` (any depth). Cutting
//! parts off the end gives its domains: level 0 is the leaf (the whole path),
//! level 1 the spine, and so on up to the root of every node with a path.
//! A node without a path is a domain of its own until the whole cluster.
//!
//! A gang goes to the lowest level at which one domain can hold it, so it
//! crosses as few switches as possible; inside that domain it uses as few
//! sub-domains as it can, level by level down to the nodes. Where there is a
//! choice, the smaller domain (fewer fitting nodes, then less free capacity)
//! wins: best fit one level up, which keeps large domains whole for large
//! gangs, as best fit over nodes keeps whole nodes for whole-node jobs.

use std::cmp::Reverse;
use std::collections::BTreeMap;

/// A level of the domain tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    /// This many parts cut off the end of the path (0: the leaf).
    Up(usize),
    /// The whole cluster, nodes without a path included.
    All,
}

/// A node's domain at some level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Domain<'a> {
    /// A prefix of topology paths; `""` is the root of all declared paths.
    Path(&'a str),
    /// A node that declares no topology, by name: alone below [`Level::All`].
    Alone(&'a str),
    /// Everything.
    All,
}

impl Domain<'_> {
    /// Whether nodes in this domain share a real switch level (not a node
    /// alone, whose neighbours are unknown).
    pub(super) fn is_shared(&self) -> bool {
        !matches!(self, Domain::Alone(_))
    }
}

/// How many parts a topology path has (0: none declared).
pub(super) fn depth(topology: &str) -> usize {
    if topology.is_empty() {
        0
    } else {
        topology.split('/').count()
    }
}

/// The domain at `level` of the node `name` with path `topology`.
pub(super) fn domain<'a>(topology: &'a str, name: &'a str, level: Level) -> Domain<'a> {
    let up = match level {
        Level::All => return Domain::All,
        Level::Up(up) => up,
    };
    if topology.is_empty() {
        return Domain::Alone(name);
    }
    let d = depth(topology);
    if up >= d {
        return Domain::Path("");
    }
    let keep = d - up;
    let end = topology
        .match_indices('/')
        .nth(keep - 1)
        .map_or(topology.len(), |(i, _)| i);
    Domain::Path(&topology[..end])
}

/// A node that can take the gang's per-node share now. A slice of them is
/// in name order (the pool's).
pub(super) struct Fit<'a> {
    pub name: &'a str,
    pub topology: &'a str,
    /// Free GPUs, CPUs and memory left after the share: lower is a better fit.
    pub left: (u64, u64, u64),
    /// The latest expected end of the jobs running there (0: none).
    pub busy_until: crate::model::Millis,
}

impl Fit<'_> {
    /// Best fit among nodes: least left free; of nodes that tie, the one
    /// busy longest (its drain is far off anyway, while one whose jobs end
    /// soon is left to drain into a whole free node); then the name, which
    /// is the order of `fits` slices: `at` is this one's position there.
    pub(super) fn best_fit_key(
        &self,
        at: usize,
    ) -> ((u64, u64, u64), Reverse<crate::model::Millis>, usize) {
        (self.left, Reverse(self.busy_until), at)
    }
}

/// Picks `want` of `fits` (positions into it) as described in the module
/// comment. With `strict` (a `--topology` level), only domains at or below
/// that level count, and `None` means none holds the gang now; otherwise
/// the answer is `None` only when `fits` has fewer than `want` nodes.
pub(super) fn choose_gang(fits: &[Fit], want: usize, strict: Option<usize>) -> Option<Vec<usize>> {
    if fits.len() < want {
        return None;
    }
    let tree = Tree {
        fits,
        max_depth: fits.iter().map(|f| depth(f.topology)).max().unwrap_or(0),
    };
    let levels: Vec<Level> = match strict {
        Some(top) => (0..=top).map(Level::Up).collect(),
        None => (0..=tree.max_depth)
            .map(Level::Up)
            .chain([Level::All])
            .collect(),
    };
    let everyone: Vec<usize> = (0..fits.len()).collect();
    for level in levels {
        let groups = tree.group(&everyone, level);
        let holding = groups
            .iter()
            .filter(|(d, m)| m.len() >= want && (d.is_shared() || want == 1));
        if let Some((_, members)) = holding.min_by_key(|(d, m)| tree.order(d, m, want, level)) {
            return Some(tree.within(members, want, level));
        }
    }
    None
}

struct Tree<'f, 'a> {
    fits: &'f [Fit<'a>],
    max_depth: usize,
}

/// Group order when choosing one: fewest sub-domains needed, fewest fitting
/// nodes, least free capacity, then the domain's name.
type GroupKey<'a> = (usize, usize, (u64, u64, u64), Domain<'a>);

impl<'a> Tree<'_, 'a> {
    /// The level below `level`, or `None` below the leaves (the nodes).
    fn below(&self, level: Level) -> Option<Level> {
        match level {
            Level::Up(0) => None,
            Level::Up(up) => Some(Level::Up(up - 1)),
            Level::All => Some(Level::Up(self.max_depth)),
        }
    }

    fn group(&self, members: &[usize], level: Level) -> BTreeMap<Domain<'a>, Vec<usize>> {
        let mut groups: BTreeMap<Domain<'a>, Vec<usize>> = BTreeMap::new();
        for &m in members {
            let f = &self.fits[m];
            groups
                .entry(domain(f.topology, f.name, level))
                .or_default()
                .push(m);
        }
        groups
    }

    fn free(&self, members: &[usize]) -> (u64, u64, u64) {
        members.iter().fold((0, 0, 0), |(g, c, m), &i| {
            let l = self.fits[i].left;
            (
                g.saturating_add(l.0),
                c.saturating_add(l.1),
                m.saturating_add(l.2),
            )
        })
    }

    fn order(&self, d: &Domain<'a>, members: &[usize], want: usize, level: Level) -> GroupKey<'a> {
        (
            self.needed(members, want, self.below(level)),
            members.len(),
            self.free(members),
            *d,
        )
    }

    /// How many domains at `level` (nodes when `None`) `want` nodes of
    /// `members` need at least.
    fn needed(&self, members: &[usize], want: usize, level: Option<Level>) -> usize {
        let Some(level) = level else { return want };
        let mut sizes: Vec<usize> = self.group(members, level).values().map(Vec::len).collect();
        sizes.sort_unstable_by_key(|&s| Reverse(s));
        let mut taken = 0;
        for (i, s) in sizes.iter().enumerate() {
            taken += s;
            if taken >= want {
                return i + 1;
            }
        }
        usize::MAX
    }

    /// `want` of `members`, which all lie in one domain at `level`.
    fn within(&self, members: &[usize], want: usize, level: Level) -> Vec<usize> {
        let Some(sub) = self.below(level) else {
            return self.best_nodes(members, want);
        };
        let groups = self.group(members, sub);
        let fitting = groups.iter().filter(|(_, m)| m.len() >= want);
        if let Some((_, m)) = fitting.min_by_key(|(d, m)| self.order(d, m, want, sub)) {
            return self.within(m, want, sub);
        }
        // No sub-domain holds it all: the largest ones whole (of equal ones,
        // those spread over the fewest domains below), and the rest in the
        // smallest that holds it.
        let below = self.below(sub);
        let mut sorted: Vec<(&Domain, &Vec<usize>)> = groups.iter().collect();
        sorted.sort_by_key(|(d, m)| {
            (
                Reverse(m.len()),
                self.needed(m, m.len(), below),
                self.free(m),
                **d,
            )
        });
        let mut out = Vec::with_capacity(want);
        let mut i = 0;
        while i < sorted.len() && out.len() + sorted[i].1.len() < want {
            out.extend(sorted[i].1.iter().copied());
            i += 1;
        }
        let rest = want - out.len();
        let last = sorted[i..]
            .iter()
            .filter(|(_, m)| m.len() >= rest)
            .min_by_key(|(d, m)| self.order(d, m, rest, sub));
        if let Some((_, m)) = last {
            out.extend(self.within(m, rest, sub));
        }
        out
    }

    /// The `want` best-fitting nodes of `members` ([`Fit::best_fit_key`]).
    fn best_nodes(&self, members: &[usize], want: usize) -> Vec<usize> {
        let mut m = members.to_vec();
        m.sort_unstable_by_key(|&i| self.fits[i].best_fit_key(i));
        m.truncate(want);
        m
    }
}
