// A map_display card drawn as SVG with no tile server and no network: a coarse outline of the
// contiguous United States, an equirectangular projection fitted to the points, one circle per
// point (data-testid="map-point") and a table of the same points for those who cannot see it.

import { el } from "./ui.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 640;
const HEIGHT = 400;

// (lon, lat), clockwise from the north-west: coarse, for orientation only.
const US_OUTLINE = [[-124.7, 48.4], [-123.0, 46.2], [-124.2, 42.0], [-124.4, 40.4], [-122.4, 37.2],
  [-120.6, 34.5], [-117.1, 32.5], [-114.7, 32.7], [-111.0, 31.3], [-108.2, 31.3], [-106.5, 31.8],
  [-104.5, 29.6], [-103.0, 29.0], [-101.4, 29.8], [-99.5, 27.5], [-97.4, 25.9], [-97.4, 27.8],
  [-95.0, 29.3], [-93.8, 29.7], [-91.5, 29.5], [-89.4, 29.0], [-89.6, 30.2], [-88.0, 30.4],
  [-86.5, 30.4], [-84.3, 29.9], [-82.8, 27.9], [-81.7, 25.9], [-80.1, 25.8], [-80.6, 28.6],
  [-81.4, 30.7], [-79.2, 33.2], [-76.5, 34.7], [-75.5, 35.5], [-76.0, 37.0], [-75.0, 38.5],
  [-74.0, 40.5], [-71.9, 41.3], [-70.0, 41.7], [-70.6, 42.7], [-70.2, 43.7], [-67.0, 44.8],
  [-67.8, 47.1], [-69.2, 47.4], [-71.5, 45.0], [-74.9, 45.0], [-76.3, 44.2], [-79.0, 43.3],
  [-79.1, 42.8], [-82.5, 41.7], [-83.1, 42.3], [-82.4, 43.0], [-82.1, 45.3], [-84.6, 46.5],
  [-88.0, 48.0], [-89.6, 48.0], [-95.2, 49.0], [-123.0, 49.0]];

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  node.append(...children);
  return node;
}

/** The points of a GeoJSON FeatureCollection: [{lon, lat, properties}] (bad ones skipped). */
export function points(card) {
  return (card.features || []).flatMap((f) => {
    const [lon, lat] = (f.geometry && f.geometry.coordinates) || [];
    return Number.isFinite(lon) && Number.isFinite(lat) ? [{ lon, lat, properties: f.properties || {} }] : [];
  });
}

function label(properties) {
  return properties.name || properties.title || Object.values(properties).slice(0, 2).join(" ");
}

/** The card element for ``card`` (the card_data of a map_display). */
export function mapCard(card, displayId) {
  const pts = points(card);
  const lons = pts.map((p) => p.lon);
  const lats = pts.map((p) => p.lat);
  const pad = 2.5;  // degrees around the points: some coast or border for orientation
  const west = (pts.length ? Math.min(...lons) : -125) - pad;
  const east = (pts.length ? Math.max(...lons) : -66) + pad;
  const south = (pts.length ? Math.min(...lats) : 24) - pad;
  const north = (pts.length ? Math.max(...lats) : 50) + pad;
  const k = Math.cos(((south + north) / 2) * Math.PI / 180);
  const scale = Math.min(WIDTH / ((east - west) * k), HEIGHT / (north - south));
  const x = (lon) => ((lon - west) * k * scale).toFixed(1);
  const y = (lat) => ((north - lat) * scale).toFixed(1);
  const width = Math.ceil((east - west) * k * scale);
  const height = Math.ceil((north - south) * scale);
  const outline = svg("polygon", { class: "outline", points: US_OUTLINE.map(([lo, la]) => `${x(lo)},${y(la)}`).join(" ") });
  const dots = pts.map((p) => svg("circle", {
    class: "point", "data-testid": "map-point", cx: x(p.lon), cy: y(p.lat), r: 6,
    "data-lon": p.lon, "data-lat": p.lat, "data-label": label(p.properties),
  }, svg("title", {}, `${label(p.properties)} (${p.lat}, ${p.lon})`)));
  const title = card.title || "Map";
  const picture = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `${title}: ${pts.length} points` },
    svg("rect", { x: 0, y: 0, width, height, fill: "#eaf3fb" }), outline, ...dots);
  const keys = [...new Set(pts.flatMap((p) => Object.keys(p.properties)))].slice(0, 6);
  const table = el("table", {}, el("thead", {}, el("tr", {}, ["lat", "lon", ...keys].map((h) => el("th", { scope: "col" }, h)))),
    el("tbody", {}, pts.map((p) => el("tr", {}, [p.lat, p.lon, ...keys.map((key) => p.properties[key] ?? "")].map((v) => el("td", {}, v))))));
  const card_ = el("figure", { class: "card map", "data-testid": "map-card", "data-display-id": displayId || "" },
    el("figcaption", {}, el("strong", {}, title), ` — ${pts.length} point${pts.length === 1 ? "" : "s"}`),
    el("div", {}, ""), el("details", {}, el("summary", {}, "The points as a table"), table));
  card_.children[1].append(picture);
  return card_;
}
