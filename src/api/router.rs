//! The route tables of the API and admin listeners: every path each serves, the method it
//! takes, and what it names ([`ApiEndpoint`], [`AdminEndpoint`]), found by `matchit` (axum's router). Built once; a
//! handler is then one exhaustive match on the endpoint (`routes.rs`).

use http::Method;

/// What a path of the ledger page names, on either listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageEndpoint {
    /// `GET /page`, `/page/`: the page, or its sign-in form.
    Dashboard,
    /// `GET /page/panel`: the page's live region.
    Panel,
    Login,
    Logout,
    /// `GET /page/receipt/{id}`
    Receipt,
    /// `POST /page/holds/{id}/approve`, `.../deny`
    HoldApprove,
    HoldDeny,
    Css,
    Js,
    Icon,
}

/// The page's routes, the same on both listeners.
const PAGE_ROUTES: &[(&str, Option<Method>, PageEndpoint)] = {
    use PageEndpoint::*;
    &[
        ("/page", GET, Dashboard),
        ("/page/", GET, Dashboard),
        ("/page/panel", GET, Panel),
        ("/page/login", POST, Login),
        ("/page/logout", POST, Logout),
        ("/page/receipt/{id}", GET, Receipt),
        ("/page/holds/{id}/approve", POST, HoldApprove),
        ("/page/holds/{id}/deny", POST, HoldDeny),
        ("/page/assets/page.css", GET, Css),
        ("/page/assets/page.js", GET, Js),
        ("/page/assets/icon.svg", GET, Icon),
    ]
};

/// What a path of the API listener names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiEndpoint {
    /// `GET /`: 303 to the ledger page.
    Home,
    Page(PageEndpoint),
    Spec,
    Stats,
    Verify,
    Estimate,
    Gate,
    Record,
    /// `POST /renew`: a digest client keeps its reservation live while it relays.
    Renew,
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
}

/// What a path of the admin listener names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminEndpoint {
    Home,
    Page(PageEndpoint),
    Metrics,
    /// `/split-profile/...`: the split-profile service, which answers its own methods.
    SplitProfile,
    /// `PUT /prices`
    PutPrices,
    /// `PUT /budget/{key_id}`
    PutBudget,
    Holds,
    HoldApprove,
    HoldDeny,
    Economics,
    Decisions,
    Sessions,
}

impl AdminEndpoint {
    /// Open without the admin key: the page (it signs in itself), `/`, `/metrics`, and
    /// split-profile (which checks the key itself).
    pub fn is_open(self) -> bool {
        matches!(
            self,
            AdminEndpoint::Page(_)
                | AdminEndpoint::Home
                | AdminEndpoint::Metrics
                | AdminEndpoint::SplitProfile
        )
    }
}

/// A route: the method it takes (`None`: its handler answers every method) and its endpoint.
#[derive(Debug, Clone)]
pub struct Route<E> {
    pub method: Option<Method>,
    pub endpoint: E,
}

/// A path the table knows: its route and the path's parameters (`id`, `key_id`).
pub struct Found<'p, E> {
    pub route: &'p Route<E>,
    pub params: matchit::Params<'p, 'p>,
}

pub struct Table<E> {
    router: matchit::Router<Route<E>>,
    /// Routes the router refused as conflicting: none (the unit test holds the tables to it).
    #[cfg_attr(not(test), allow(dead_code))]
    conflicts: usize,
}

const ANY: Option<Method> = None;
const GET: Option<Method> = Some(Method::GET);
const POST: Option<Method> = Some(Method::POST);
const PUT: Option<Method> = Some(Method::PUT);

impl<E: Copy> Table<E> {
    /// The listener's own routes and the page's (`page` names the listener's page endpoint).
    fn of(routes: &[(&str, Option<Method>, E)], page: fn(PageEndpoint) -> E) -> Table<E> {
        let mut router = matchit::Router::new();
        let mut conflicts = 0;
        let pages = PAGE_ROUTES
            .iter()
            .map(|(p, m, e)| (*p, m.clone(), page(*e)));
        let own = routes.iter().map(|(p, m, e)| (*p, m.clone(), *e));
        for (path, method, endpoint) in own.chain(pages) {
            let route = Route { method, endpoint };
            if router.insert(path, route).is_err() {
                tracing::error!(path, "route table: a conflicting route is not served");
                conflicts += 1;
            }
        }
        Table { router, conflicts }
    }

    pub fn find<'p>(&'p self, path: &'p str) -> Option<Found<'p, E>> {
        let matched = self.router.at(path).ok()?;
        Some(Found {
            route: matched.value,
            params: matched.params,
        })
    }
}

impl Table<ApiEndpoint> {
    /// The API listener's routes (SPEC §3).
    pub fn api() -> Self {
        use ApiEndpoint::*;
        Table::of(
            &[
                ("/", GET, Home),
                ("/spec", GET, Spec),
                ("/stats", GET, Stats),
                ("/verify", POST, Verify),
                ("/estimate", POST, Estimate),
                ("/gate", POST, Gate),
                ("/record", POST, Record),
                ("/renew", POST, Renew),
                ("/ledger", GET, Ledger),
                ("/ledger/decisions", GET, Decisions),
                ("/ledger/sessions", GET, Sessions),
                ("/budget", GET, Budget),
                ("/prices", GET, Prices),
                ("/forget", POST, Forget),
                ("/holds", GET, Holds),
                ("/holds/", GET, Holds),
                ("/holds/{id}/approve", POST, HoldApprove),
                ("/holds/{id}/deny", POST, HoldDeny),
            ],
            Page,
        )
    }
}

impl Table<AdminEndpoint> {
    /// The admin listener's routes (`/healthz` and `/readyz` are answered before these, by
    /// the listener's shell).
    pub fn admin() -> Self {
        use AdminEndpoint::*;
        Table::of(
            &[
                ("/", GET, Home),
                ("/metrics", GET, Metrics),
                ("/split-profile/", ANY, SplitProfile),
                ("/split-profile/{*rest}", ANY, SplitProfile),
                ("/prices", PUT, PutPrices),
                ("/budget/{key_id}", PUT, PutBudget),
                ("/holds", GET, Holds),
                ("/holds/", GET, Holds),
                ("/holds/{id}/approve", POST, HoldApprove),
                ("/holds/{id}/deny", POST, HoldDeny),
                ("/economics", GET, Economics),
                ("/ledger/decisions", GET, Decisions),
                ("/ledger/sessions", GET, Sessions),
            ],
            Page,
        )
    }
}

impl<E> Route<E> {
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
        let at = |p: &str| api.find(p).map(|f| f.route.endpoint);
        let at_admin = |p: &str| admin.find(p).map(|f| f.route.endpoint);
        assert_eq!(at("/record"), Some(ApiEndpoint::Record));
        assert_eq!(
            at("/page/receipt/d1"),
            Some(ApiEndpoint::Page(PageEndpoint::Receipt))
        );
        assert_eq!(at("/page/receipt"), None);
        assert_eq!(
            at("/page"),
            Some(ApiEndpoint::Page(PageEndpoint::Dashboard))
        );
        assert_eq!(
            at_admin("/page/"),
            Some(AdminEndpoint::Page(PageEndpoint::Dashboard))
        );
        assert_eq!(
            at_admin("/page/holds/hold_1/deny"),
            Some(AdminEndpoint::Page(PageEndpoint::HoldDeny))
        );
        let found = api.find("/holds/hold_ab12/approve").unwrap();
        assert_eq!(found.route.endpoint, ApiEndpoint::HoldApprove);
        assert_eq!(found.params.get("id"), Some("hold_ab12"));
        assert_eq!(at("/holds/x/y/approve"), None);
        assert_eq!(at("/record/"), None);
        assert_eq!(
            at("/metrics"),
            None,
            "an admin route is not on the API listener"
        );
        assert_eq!(at_admin("/budget/k1"), Some(AdminEndpoint::PutBudget));
        assert_eq!(
            at_admin("/split-profile/check"),
            Some(AdminEndpoint::SplitProfile)
        );
        assert_eq!(at_admin("/forget"), None);
        // The hold routes, as `HoldRoute` names them.
        assert_eq!(at_admin("/holds"), Some(AdminEndpoint::Holds));
        assert_eq!(at_admin("/holds/"), Some(AdminEndpoint::Holds));
        let deny = admin.find("/holds/hold_1/deny").unwrap();
        assert_eq!(
            (deny.route.endpoint, deny.params.get("id")),
            (AdminEndpoint::HoldDeny, Some("hold_1"))
        );
        for bad in [
            "/holds//approve",
            "/holds/a/b/approve",
            "/holds/a/other",
            "/holdsx",
            "/holds/a",
        ] {
            assert_eq!(at_admin(bad), None, "{bad}");
            assert_eq!(at(bad), None, "{bad}");
        }
        assert!(!api.find("/gate").unwrap().route.allows(&Method::GET));
        assert_eq!(at("/page/x"), None);
        assert!(api.find("/page/login").unwrap().route.allows(&Method::POST));
        assert!(!api.find("/page/panel").unwrap().route.allows(&Method::POST));
    }
}
