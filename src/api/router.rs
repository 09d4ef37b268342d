//! The route tables of the API and admin listeners: every path each serves, the method it
//! takes, and what it names ([`Endpoint`]), found by `matchit` (axum's router). Built once; a
//! handler is then one exhaustive match on the endpoint (`routes.rs`).

use http::Method;

/// What a path of the API or admin listener names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /`: 303 to the ledger page.
    Home,
    /// `/page`, `/page/...`: the ledger page, which answers its own methods.
    Page,
    Spec,
    Stats,
    Verify,
    Estimate,
    Gate,
    Record,
    Ledger,
    Decisions,
    Sessions,
    Budget,
    Prices,
    Forget,
    /// `GET /holds`
    Holds,
    /// `POST /holds/{id}/approve`
    HoldApprove,
    /// `POST /holds/{id}/deny`
    HoldDeny,
    Metrics,
    /// `/split-profile/...`: the split-profile service, which answers its own methods.
    SplitProfile,
    /// `PUT /prices` (admin)
    PutPrices,
    /// `PUT /budget/{key_id}` (admin)
    PutBudget,
    Economics,
}

/// A route: the method it takes (`None`: its handler answers every method) and its endpoint.
#[derive(Debug, Clone)]
pub struct Route {
    pub method: Option<Method>,
    pub endpoint: Endpoint,
}

/// A path the table knows: its route and the path's parameters (`id`, `key_id`).
pub struct Found<'p> {
    pub route: &'p Route,
    pub params: matchit::Params<'p, 'p>,
}

pub struct Table {
    router: matchit::Router<Route>,
    /// Routes the router refused as conflicting: none (the unit test holds the tables to it).
    #[cfg_attr(not(test), allow(dead_code))]
    conflicts: usize,
}

impl Table {
    fn of(routes: &[(&str, Option<Method>, Endpoint)]) -> Table {
        let mut router = matchit::Router::new();
        let mut conflicts = 0;
        for (path, method, endpoint) in routes {
            let route = Route {
                method: method.clone(),
                endpoint: *endpoint,
            };
            if router.insert(*path, route).is_err() {
                tracing::error!(path, "route table: a conflicting route is not served");
                conflicts += 1;
            }
        }
        Table { router, conflicts }
    }

    /// The API listener's routes (SPEC §3).
    pub fn api() -> Table {
        use Endpoint::*;
        let (get, post) = (Some(Method::GET), Some(Method::POST));
        Table::of(&[
            ("/", get.clone(), Home),
            ("/page", None, Page),
            ("/page/", None, Page),
            ("/page/{*rest}", None, Page),
            ("/spec", get.clone(), Spec),
            ("/stats", get.clone(), Stats),
            ("/verify", post.clone(), Verify),
            ("/estimate", post.clone(), Estimate),
            ("/gate", post.clone(), Gate),
            ("/record", post.clone(), Record),
            ("/ledger", get.clone(), Ledger),
            ("/ledger/decisions", get.clone(), Decisions),
            ("/ledger/sessions", get.clone(), Sessions),
            ("/budget", get.clone(), Budget),
            ("/prices", get.clone(), Prices),
            ("/forget", post.clone(), Forget),
            ("/holds", get.clone(), Holds),
            ("/holds/", get, Holds),
            ("/holds/{id}/approve", post.clone(), HoldApprove),
            ("/holds/{id}/deny", post, HoldDeny),
        ])
    }

    /// The admin listener's routes (`/healthz` and `/readyz` are answered before these, by
    /// the listener's shell).
    pub fn admin() -> Table {
        use Endpoint::*;
        let (get, post, put) = (Some(Method::GET), Some(Method::POST), Some(Method::PUT));
        Table::of(&[
            ("/", get.clone(), Home),
            ("/page", None, Page),
            ("/page/", None, Page),
            ("/page/{*rest}", None, Page),
            ("/metrics", get.clone(), Metrics),
            ("/split-profile/", None, SplitProfile),
            ("/split-profile/{*rest}", None, SplitProfile),
            ("/prices", put.clone(), PutPrices),
            ("/budget/{key_id}", put, PutBudget),
            ("/holds", get.clone(), Holds),
            ("/holds/", get.clone(), Holds),
            ("/holds/{id}/approve", post.clone(), HoldApprove),
            ("/holds/{id}/deny", post, HoldDeny),
            ("/economics", get.clone(), Economics),
            ("/ledger/decisions", get.clone(), Decisions),
            ("/ledger/sessions", get, Sessions),
        ])
    }

    pub fn find<'p>(&'p self, path: &'p str) -> Option<Found<'p>> {
        let matched = self.router.at(path).ok()?;
        Some(Found {
            route: matched.value,
            params: matched.params,
        })
    }
}

impl Route {
    /// Whether `method` may call it.
    pub fn allows(&self, method: &Method) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_finds_its_endpoint_and_nothing_else_matches() {
        let (api, admin) = (Table::api(), Table::admin());
        assert_eq!((api.conflicts, admin.conflicts), (0, 0));
        let at = |t: &Table, p: &str| t.find(p).map(|f| f.route.endpoint);
        assert_eq!(at(&api, "/record"), Some(Endpoint::Record));
        assert_eq!(at(&api, "/page/receipt"), Some(Endpoint::Page));
        assert_eq!(at(&api, "/page"), Some(Endpoint::Page));
        assert_eq!(at(&admin, "/page/"), Some(Endpoint::Page));
        let found = api.find("/holds/hold_ab12/approve").unwrap();
        assert_eq!(found.route.endpoint, Endpoint::HoldApprove);
        assert_eq!(found.params.get("id"), Some("hold_ab12"));
        assert_eq!(at(&api, "/holds/x/y/approve"), None);
        assert_eq!(at(&api, "/record/"), None);
        assert_eq!(
            at(&api, "/metrics"),
            None,
            "an admin route is not on the API listener"
        );
        assert_eq!(at(&admin, "/budget/k1"), Some(Endpoint::PutBudget));
        assert_eq!(
            at(&admin, "/split-profile/check"),
            Some(Endpoint::SplitProfile)
        );
        assert_eq!(at(&admin, "/forget"), None);
        assert!(!api.find("/gate").unwrap().route.allows(&Method::GET));
        assert!(api.find("/page/x").unwrap().route.allows(&Method::POST));
    }
}
